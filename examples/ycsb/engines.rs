//! The engines compared, behind one small trait. Each opens with a memory budget and a
//! directory of its own; the driver never looks inside them.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

/// Errors of an engine, as text: the driver only reports them.
pub type EngineResult<T> = Result<T, String>;

/// How durable a write is when the engine's call returns (`--durability`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// Not logged: a crash keeps what the engine last wrote to its files (bfdb: its last
    /// checkpoint; RocksDB: its flushed tables). The driver's runs before durability.
    #[default]
    None,
    /// In the engine's log, which the engine makes durable in the background: a crash of
    /// the process loses nothing the OS got, a crash of the machine a few milliseconds.
    Logged,
    /// On stable storage when the call returns (an fsync or fdatasync covers it).
    Synced,
}

impl Durability {
    pub fn name(self) -> &'static str {
        match self {
            Durability::None => "none",
            Durability::Logged => "logged",
            Durability::Synced => "synced",
        }
    }
}

/// An engine as `--engines` names it: `bfdb`, or with a durability of its own,
/// `bfdb:synced`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineSpec {
    /// The engine (a name of [`ENGINE_NAMES`]).
    pub name: String,
    pub durability: Durability,
    /// What results call it: the text as given (`bfdb`, `bfdb:synced`).
    pub label: String,
}

impl EngineSpec {
    /// Parses `name` or `name:level`; a plain name takes `default` (`--durability`).
    pub fn parse(text: &str, default: Durability) -> Result<EngineSpec, String> {
        let (name, durability) = match text.split_once(':') {
            None => (text, default),
            Some((name, level)) => {
                let level =
                    <Durability as clap::ValueEnum>::from_str(level, true).map_err(|_| {
                        format!("{text}: unknown durability {level:?}; known: none, logged, synced")
                    })?;
                (name, level)
            }
        };
        if !ENGINE_NAMES.contains(&name) {
            return Err(format!(
                "unknown engine {name}; known: {}",
                ENGINE_NAMES.join(", ")
            ));
        }
        Ok(EngineSpec {
            name: name.to_string(),
            durability,
            label: text.to_string(),
        })
    }

    /// Refuses a durability level the engine does not have, with the reason.
    pub fn check(&self, in_memory: bool) -> Result<(), String> {
        if in_memory && !has_in_memory_mode(&self.name) {
            return Err(format!(
                "{}: --in-memory is not available: {} keeps its records in files",
                self.label, self.name
            ));
        }
        let why = match (self.name.as_str(), self.durability) {
            (_, Durability::None) => return Ok(()),
            ("bfdb", _) if in_memory => {
                "with --in-memory bfdb runs Tree::in_memory, which has no log"
            }
            ("bfdb-tree", _) => "bfdb-tree is a Tree on a scratch file, which has no log",
            ("bftree", _) => "the bf-tree crate has no log",
            ("btreemap", _) => "RwLock<BTreeMap> keeps nothing on disk",
            ("oxifaster", _) => {
                "oxifaster's FasterKv logs no writes: its durability is CPR checkpoints, \
                 which the driver does not take"
            }
            ("sled", _) => {
                "the driver runs sled only as it always has (flush every 1 s), with no \
                 per-write durability level"
            }
            ("redb", Durability::Logged) => {
                return Err(format!(
                    "{}: durability logged is not available: redb 4 has no commit that \
                     reaches the OS without an fsync (3.0 removed `Durability::Eventual`), \
                     and its `None` commits are lost when the process dies before a durable \
                     one; it runs with `none` or `synced` (write it as redb:none or \
                     redb:synced to keep it in a run of another --durability)",
                    self.label
                ));
            }
            _ => return Ok(()),
        };
        Err(format!(
            "{}: durability {} is not available: {why}; it runs only with `none` \
             (write it as {}:none to keep it in a run of another --durability)",
            self.label,
            self.durability.name(),
            self.name
        ))
    }
}

/// How an engine is opened.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// The memory budget for cached and buffered records.
    pub budget_bytes: u64,
    /// A directory the engine owns (empty when opened).
    pub dir: PathBuf,
    /// Bypass the OS page cache where the engine can.
    pub direct_io: bool,
    /// Keep data in memory instead of files, where the engine has such a mode.
    pub in_memory: bool,
    /// Use bf-tree's io_uring backend instead of its O_DIRECT `pread`/`pwrite` one.
    pub bftree_io_uring: bool,
    /// bfdb's backend with direct IO on (`--bfdb-backend`).
    pub bfdb_backend: String,
    /// bfdb's `Config::value_cache_percent`, if given (`--bfdb-value-cache-percent`).
    pub bfdb_value_cache_percent: Option<u8>,
    pub key_bytes: usize,
    pub value_bytes: usize,
    /// Records the load inserts (hash engines size their indexes by it).
    pub records: u64,
    /// bfdb-hash: the hot log's disk budget, if given (`--hash-hot-log-mib`).
    pub hash_hot_log_bytes: Option<u64>,
    /// bfdb-hash: the read cache's memory, if given (`--hash-read-cache-mib`).
    pub hash_read_cache_bytes: Option<u64>,
    /// bfdb-hash: the HashStore's `compaction_threads`.
    pub hash_compaction_threads: usize,
    /// bfdb, bfdb-hash: the `Db`'s checkpoint trigger in log bytes, if given.
    pub checkpoint_log_bytes: Option<u64>,
    /// How durable a write is when `insert`, `update` or `load_batch` returns.
    pub durability: Durability,
}

/// What an engine's own recovery reported on open, where it reports anything.
#[derive(Clone, Debug, Default)]
pub struct RecoveryInfo {
    /// The engine's own measure of the recovery's wall time.
    pub secs: f64,
    /// Log bytes read from the checkpoint's position on.
    pub log_bytes: u64,
    /// Log records (single writes and batches) replayed.
    pub records_replayed: u64,
}

/// One key-value engine under test. Every method takes `&self`: threads share the engine.
pub trait Engine: Send + Sync {
    /// How the engine stores and caches data in this run (shown with every number).
    fn mode(&self) -> String;
    /// The memory budget the engine was actually given (some round it).
    fn budget_bytes(&self) -> u64;
    /// Inserts or replaces a record.
    fn insert(&self, key: &[u8], value: &[u8]) -> EngineResult<()>;
    /// Replaces the value of an existing record (a blind write).
    fn update(&self, key: &[u8], value: &[u8]) -> EngineResult<()> {
        self.insert(key, value)
    }
    /// Reads a record's value into `out` (its contents are scratch afterwards); tells
    /// whether the key exists.
    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> EngineResult<bool>;
    /// Reads every key of `keys`; returns how many exist. Engines with a multi-key read
    /// use it.
    fn get_many(&self, keys: &[Vec<u8>]) -> EngineResult<usize> {
        let mut out = Vec::new();
        let mut found = 0;
        for key in keys {
            found += usize::from(self.get(key, &mut out)?);
        }
        Ok(found)
    }
    /// Reads up to `count` records from `start` on, in key order; returns how many.
    fn scan(&self, start: &[u8], count: usize) -> EngineResult<usize>;
    /// Inserts a batch of records during the load phase.
    fn load_batch(&self, records: &[(Vec<u8>, Vec<u8>)]) -> EngineResult<()> {
        records.iter().try_for_each(|(k, v)| self.insert(k, v))
    }
    /// Makes buffered writes reach the files, where the engine has such a call.
    fn flush(&self) -> EngineResult<()> {
        Ok(())
    }
    /// The engine's own counters, for `--stats`, where it has any.
    fn stats(&self) -> Option<String> {
        None
    }
    /// What the engine's recovery did when it was opened, where it says.
    fn recovery(&self) -> Option<RecoveryInfo> {
        None
    }
}

/// The engines the driver knows, including those behind cargo features.
pub const ENGINE_NAMES: &[&str] = &[
    "bfdb",
    "bfdb-hash",
    "bfdb-hash-log",
    "bfdb-tree",
    "bftree",
    "btreemap",
    "rocksdb",
    "rocksdb-blob",
    "sled",
    "fjall",
    "fjall-blob",
    "redb",
    "oxifaster",
];

/// The value length above which the engines with key-value separation keep a value out of
/// their trees: bfdb's default inline limit (`Config::max_inline_value_bytes`), so that
/// every engine separates the same values. RocksDB's `min_blob_size` and fjall's
/// `separation_threshold` separate values of at least this many bytes, bfdb those longer
/// than it: the same values for every size the driver's tables use.
#[cfg(any(feature = "rocksdb", feature = "fjall"))]
pub fn blob_threshold_bytes() -> u64 {
    bfdb::Config::default().max_inline_value_bytes as u64
}

/// Engines that can be opened again on the files a run left (`--recovery`).
pub fn reopens(name: &str, in_memory: bool) -> bool {
    match name {
        "bfdb" | "bfdb-hash" | "bfdb-hash-log" => !in_memory,
        "rocksdb" | "rocksdb-blob" | "sled" | "fjall" | "fjall-blob" | "redb" => true,
        _ => false,
    }
}

/// Whether the engine has range scans. Hash engines answer point operations only: the
/// driver skips the workloads with scans (scan, YCSB E) for them.
pub fn scans(name: &str) -> bool {
    !matches!(name, "bfdb-hash" | "bfdb-hash-log" | "oxifaster")
}

/// Whether the driver runs `workload` on the engine: every workload, except those with
/// scans on an engine without them.
pub fn runs_workload(name: &str, workload: crate::keygen::Workload) -> bool {
    scans(name) || workload.mix().scan == 0
}

/// Whether the engine has a mode that keeps its records in memory (`--in-memory`).
fn has_in_memory_mode(name: &str) -> bool {
    !matches!(name, "bfdb-hash" | "bfdb-hash-log" | "oxifaster")
}

/// Opens the engine called `name`.
pub fn open(name: &str, options: &OpenOptions) -> EngineResult<Box<dyn Engine>> {
    std::fs::create_dir_all(&options.dir)
        .map_err(|e| format!("cannot create {}: {e}", options.dir.display()))?;
    match name {
        "bfdb" if options.in_memory => Ok(Box::new(Bfdb::open(options)?)),
        "bfdb" => Ok(Box::new(BfdbDb::open(options)?)),
        "bfdb-hash" => Ok(Box::new(BfdbHash::open(options, bfdb::ColdLayout::Runs)?)),
        "bfdb-hash-log" => Ok(Box::new(BfdbHash::open(options, bfdb::ColdLayout::Log)?)),
        "bfdb-tree" => Ok(Box::new(Bfdb::open(options)?)),
        "bftree" => Ok(Box::new(BfTree::open(options)?)),
        "btreemap" => Ok(Box::new(LockedBTreeMap::default())),
        #[cfg(feature = "rocksdb")]
        "rocksdb" => Ok(Box::new(rocks::Rocks::open(options, false)?)),
        #[cfg(feature = "rocksdb")]
        "rocksdb-blob" => Ok(Box::new(rocks::Rocks::open(options, true)?)),
        #[cfg(feature = "sled")]
        "sled" => Ok(Box::new(sled_engine::Sled::open(options)?)),
        #[cfg(feature = "fjall")]
        "fjall" => Ok(Box::new(fjall_engine::Fjall::open(options, false)?)),
        #[cfg(feature = "fjall")]
        "fjall-blob" => Ok(Box::new(fjall_engine::Fjall::open(options, true)?)),
        #[cfg(feature = "redb")]
        "redb" => Ok(Box::new(redb_engine::Redb::open(options)?)),
        #[cfg(feature = "oxifaster")]
        "oxifaster" => Ok(Box::new(oxifaster_engine::Oxifaster::open(options)?)),
        other if ENGINE_NAMES.contains(&other) => {
            // `rocksdb-blob` is behind `rocksdb`, `fjall-blob` behind `fjall`.
            let feature = other.strip_suffix("-blob").unwrap_or(other);
            Err(format!(
                "engine {other} is behind the cargo feature {feature}: \
                 cargo run --release --example ycsb --features {feature} -- ..."
            ))
        }
        other => Err(format!(
            "unknown engine {other}; known: {}",
            ENGINE_NAMES.join(", ")
        )),
    }
}

/// How much room the files under a directory take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirSize {
    /// The files' lengths summed (`ls -l`, `du --apparent-size`).
    pub apparent_bytes: u64,
    /// The blocks the filesystem allocated to them (`st_blocks` × 512, as `du` counts):
    /// below the apparent size where a file has holes (bfdb's value store punches one for
    /// each value it frees), above it by the tail of each file's last block.
    pub allocated_bytes: u64,
}

/// The sizes of the files under `dir`, zeros if it does not exist.
pub fn dir_size(dir: &Path) -> DirSize {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return DirSize::default();
    };
    let mut size = DirSize::default();
    for entry in entries.flatten() {
        let Ok(m) = entry.metadata() else { continue };
        if m.is_dir() {
            let inner = dir_size(&entry.path());
            size.apparent_bytes += inner.apparent_bytes;
            size.allocated_bytes += inner.allocated_bytes;
        } else {
            size.apparent_bytes += m.len();
            // `st_blocks` counts 512-byte units whatever the filesystem's block size.
            size.allocated_bytes += m.blocks() * 512;
        }
    }
    size
}

/// Bytes of the files under `dir` (apparent sizes), 0 if it does not exist.
pub fn dir_size_bytes(dir: &Path) -> u64 {
    dir_size(dir).apparent_bytes
}

// ---------------------------------------------------------------------------------------
// bfdb

struct Bfdb {
    tree: bfdb::Tree,
    mode: String,
}

/// The backend of file-backed bfdb trees.
///
/// bfdb's backend: with direct IO, the one `--bfdb-backend` names (default `auto`, what
/// users get from `Backend::default()`); without, buffered `pread`/`pwrite`.
fn bfdb_backend(options: &OpenOptions) -> bfdb::Backend {
    if !options.direct_io {
        return bfdb::Backend::Std;
    }
    match options.bfdb_backend.as_str() {
        "io-uring" => bfdb::Backend::IoUring,
        "std-direct" => bfdb::Backend::StdDirect,
        _ => bfdb::Backend::Auto,
    }
}

/// bfdb's `Config` for the driver's budget and backend, the same for a `Db`'s keyspace
/// and a plain `Tree`.
fn bfdb_config(options: &OpenOptions) -> bfdb::Config {
    let defaults = bfdb::Config::default();
    bfdb::Config {
        memory_budget_bytes: options.budget_bytes,
        backend: bfdb_backend(options),
        value_cache_percent: options
            .bfdb_value_cache_percent
            .unwrap_or(defaults.value_cache_percent),
        ..defaults
    }
}

/// How a file-backed bfdb tree does its IO: the backend that is active, not the one asked
/// for (`Auto` resolves to io_uring or pread), and any fallback the tree reported.
fn bfdb_io_mode(tree: &bfdb::Tree, options: &OpenOptions) -> String {
    let stats = tree.stats();
    let notice = stats
        .backend_notice
        .as_deref()
        .map_or(String::new(), |n| format!("; {n}"));
    if stats.direct_io {
        format!("{} with O_DIRECT{notice}", stats.backend)
    } else if options.direct_io {
        format!("{} buffered (O_DIRECT refused){notice}", stats.backend)
    } else {
        format!("{} buffered", stats.backend)
    }
}

impl Bfdb {
    fn open(options: &OpenOptions) -> EngineResult<Bfdb> {
        let config = bfdb_config(options);
        let tree = if options.in_memory {
            bfdb::Tree::in_memory(config)
        } else {
            bfdb::Tree::open(options.dir.join("bfdb.tree"), config)
        }
        .map_err(|e| e.to_string())?;
        let mode = if options.in_memory {
            "leaf pages in memory".to_string()
        } else {
            format!(
                "Tree on a scratch file (no log), {}",
                bfdb_io_mode(&tree, options)
            )
        };
        Ok(Bfdb { tree, mode })
    }
}

impl Engine for Bfdb {
    fn mode(&self) -> String {
        self.mode.clone()
    }
    fn budget_bytes(&self) -> u64 {
        self.tree.config().memory_budget_bytes
    }
    fn insert(&self, key: &[u8], value: &[u8]) -> EngineResult<()> {
        self.tree.insert(key, value).map_err(|e| e.to_string())
    }
    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> EngineResult<bool> {
        self.tree.get_into(key, out).map_err(|e| e.to_string())
    }
    fn get_many(&self, keys: &[Vec<u8>]) -> EngineResult<usize> {
        let found = self.tree.get_many(keys).map_err(|e| e.to_string())?;
        Ok(found.iter().filter(|v| v.is_some()).count())
    }
    fn scan(&self, start: &[u8], count: usize) -> EngineResult<usize> {
        // The lending cursor copies records into one reused buffer, as bf-tree's
        // `scan_with_count` copies into the caller's.
        let mut cursor = self.tree.cursor(start..);
        let mut n = 0;
        while n < count {
            let Some(record) = cursor.next() else { break };
            let (k, v) = record.map_err(|e| e.to_string())?;
            std::hint::black_box((k, v));
            n += 1;
        }
        Ok(n)
    }
    fn flush(&self) -> EngineResult<()> {
        self.tree.flush().map_err(|e| e.to_string())
    }
    fn stats(&self) -> Option<String> {
        Some(format!("{:?}", self.tree.stats()))
    }
}

// ---------------------------------------------------------------------------------------
// bfdb's Db: a database directory with one keyspace, its log at the durability asked for

/// The keyspace the driver's records go to.
const KEYSPACE: &str = "ycsb";

struct BfdbDb {
    // Dropped before the `Db` (fields drop in order), as a user's handles would be.
    tree: std::sync::Arc<bfdb::Tree>,
    db: bfdb::Db,
    /// The level of single writes (`tree.insert` uses the `Db`'s, which is this one).
    durability: bfdb::Durability,
    mode: String,
}

/// bfdb's level for the driver's `--durability`.
fn bfdb_durability(durability: Durability) -> bfdb::Durability {
    match durability {
        Durability::None => bfdb::Durability::Unlogged,
        Durability::Logged => bfdb::Durability::Logged,
        Durability::Synced => bfdb::Durability::Synced,
    }
}

/// What a `Db`'s writes are at `durability`, for the mode string.
fn bfdb_level_text(durability: Durability) -> &'static str {
    match durability {
        Durability::None => "unlogged writes",
        Durability::Logged => "logged writes (flushed every 5 ms)",
        Durability::Synced => "synced writes (group commit)",
    }
}

/// A `Db`'s options: `config`, the run's durability, and the checkpoint trigger if given
/// (checkpoints otherwise on their default triggers, 64 MiB of log and 60 s).
fn bfdb_db_options(options: &OpenOptions, config: bfdb::Config) -> bfdb::DbOptions {
    let db_options = bfdb::DbOptions::default()
        .config(config)
        .durability(bfdb_durability(options.durability));
    match options.checkpoint_log_bytes {
        Some(bytes) => db_options.checkpoint_log_bytes(bytes),
        None => db_options,
    }
}

/// What a `Db`'s recovery on open did, as the driver reports it.
fn bfdb_recovery(db: &bfdb::Db) -> RecoveryInfo {
    let r = db.recovery();
    RecoveryInfo {
        secs: r.duration.as_secs_f64(),
        log_bytes: r.log_bytes,
        records_replayed: r.records_replayed,
    }
}

impl BfdbDb {
    fn open(options: &OpenOptions) -> EngineResult<BfdbDb> {
        let durability = bfdb_durability(options.durability);
        let db_options = bfdb_db_options(options, bfdb_config(options));
        let db = bfdb::Db::open(options.dir.join("bfdb"), db_options).map_err(|e| e.to_string())?;
        let tree = db.tree(KEYSPACE).map_err(|e| e.to_string())?;
        let level = bfdb_level_text(options.durability);
        let checkpoints = match options.checkpoint_log_bytes {
            Some(0) => ", no log-size checkpoints".to_string(),
            Some(bytes) => format!(", checkpoints every {} MiB of log", bytes >> 20),
            None => String::new(),
        };
        let mode = format!("Db, {level}{checkpoints}, {}", bfdb_io_mode(&tree, options));
        Ok(BfdbDb {
            tree,
            db,
            durability,
            mode,
        })
    }
}

impl Engine for BfdbDb {
    fn mode(&self) -> String {
        self.mode.clone()
    }
    fn budget_bytes(&self) -> u64 {
        self.tree.config().memory_budget_bytes
    }
    fn insert(&self, key: &[u8], value: &[u8]) -> EngineResult<()> {
        self.tree.insert(key, value).map_err(|e| e.to_string())
    }
    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> EngineResult<bool> {
        self.tree.get_into(key, out).map_err(|e| e.to_string())
    }
    fn get_many(&self, keys: &[Vec<u8>]) -> EngineResult<usize> {
        let found = self.tree.get_many(keys).map_err(|e| e.to_string())?;
        Ok(found.iter().filter(|v| v.is_some()).count())
    }
    fn scan(&self, start: &[u8], count: usize) -> EngineResult<usize> {
        let mut cursor = self.tree.cursor(start..);
        let mut n = 0;
        while n < count {
            let Some(record) = cursor.next() else { break };
            let (k, v) = record.map_err(|e| e.to_string())?;
            std::hint::black_box((k, v));
            n += 1;
        }
        Ok(n)
    }
    fn load_batch(&self, records: &[(Vec<u8>, Vec<u8>)]) -> EngineResult<()> {
        if self.durability != bfdb::Durability::Synced {
            // Record by record: a batch is logged whatever the level, so unlogged loads
            // cannot use one; and logged loads ran faster without (126K and 107K records/s
            // against 90K and 59K, alternating, docs/benchmarks.md).
            return records.iter().try_for_each(|(k, v)| self.insert(k, v));
        }
        // One log record and one wait for the disk per load batch.
        let mut batch = bfdb::WriteBatch::new();
        for (k, v) in records {
            batch.insert(&self.tree, k, v);
        }
        self.db
            .write_with(batch, self.durability)
            .map_err(|e| e.to_string())
    }
    /// A checkpoint: the loaded records written to their leaf pages (as `Tree::flush`
    /// does) and recorded, so that a reopen replays no load.
    fn flush(&self) -> EngineResult<()> {
        self.db.checkpoint().map_err(|e| e.to_string())
    }
    fn stats(&self) -> Option<String> {
        Some(format!("{:?}; {:?}", self.tree.stats(), self.db.stats()))
    }
    fn recovery(&self) -> Option<RecoveryInfo> {
        Some(bfdb_recovery(&self.db))
    }
}

// ---------------------------------------------------------------------------------------
// bfdb's HashStore: a Db with one hash keyspace, which gets the memory budget but the
// least the Db's trees keep

/// The hash keyspace the driver's records go to.
const HASH_KEYSPACE: &str = "ycsb-hash";

struct BfdbHash {
    // Dropped before the `Db`, as a user's handles would be.
    store: std::sync::Arc<bfdb::HashStore>,
    db: bfdb::Db,
    durability: bfdb::Durability,
    budget_bytes: u64,
    mode: String,
}

impl BfdbHash {
    fn open(options: &OpenOptions, cold_layout: bfdb::ColdLayout) -> EngineResult<BfdbHash> {
        let durability = bfdb_durability(options.durability);
        // The hash store's memory comes out of the Db's budget; the Db's trees (none
        // here) keep the least the Config allows.
        let tree_pool_bytes = bfdb::config::MIN_MEMORY_BUDGET_BYTES;
        let config = bfdb_config(options);
        let db_options = bfdb_db_options(options, config);
        let db = bfdb::Db::open(options.dir.join("bfdb"), db_options).map_err(|e| e.to_string())?;
        // The created store keeps its options (a reopen for --recovery finds them in the
        // manifest). The cold log's disk budget stays at its default.
        let hot_log_disk_bytes = options
            .hash_hot_log_bytes
            .unwrap_or_else(|| hot_log_fitting_index(options));
        let mut hash_options = bfdb::HashStoreOptions::default()
            .memory_bytes(options.budget_bytes.saturating_sub(tree_pool_bytes))
            .expected_keys(options.records.max(1))
            .hot_log_disk_bytes(hot_log_disk_bytes)
            .compaction_threads(options.hash_compaction_threads)
            .cold_layout(cold_layout);
        if let Some(bytes) = options.hash_read_cache_bytes {
            hash_options = hash_options.read_cache_bytes(bytes);
        }
        let store = db
            .hash_store_with(HASH_KEYSPACE, hash_options.clone())
            .map_err(|e| e.to_string())?;
        let io = if options.direct_io {
            "log files with O_DIRECT (buffered where the filesystem refuses it)"
        } else {
            "log files buffered"
        };
        let mode = format!(
            "Db with one HashStore (no scans), {}; memory: HashStore {:.2} MiB (hot index, \
             read cache, log pages) out of the Db's budget, its trees {} KiB (the least \
             the Db allows); \
             expected_keys {}, read cache {}, hot log disk {:.1} MiB, cold log disk {} MiB, \
             {} compaction threads, cold tier {:?}; {io}",
            bfdb_level_text(options.durability),
            hash_options.memory_bytes.unwrap_or(0) as f64 / (1 << 20) as f64,
            tree_pool_bytes >> 10,
            hash_options.expected_keys,
            match hash_options.read_cache_bytes {
                Some(bytes) => format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64),
                None => "the default share (a third)".to_string(),
            },
            hash_options.hot_log_disk_bytes as f64 / (1 << 20) as f64,
            hash_options.cold_log_disk_bytes >> 20,
            hash_options.compaction_threads,
            hash_options.cold_layout,
        );
        Ok(BfdbHash {
            store,
            db,
            durability,
            budget_bytes: options.budget_bytes,
            mode,
        })
    }
}

/// The hot log's disk budget that keeps a HashStore's hot index in its share of the
/// memory: as many records as the index's home buckets hold on average, a sixth of the
/// memory in 64-byte buckets (a power of two of them, rounded down) of 4 keys
/// (`HashStoreOptions` documents the split). The hot
/// index has an entry per key with a record in the hot log, and a hot log of more keys
/// than that makes overflow buckets outside the budget (with a 1 GiB hot log, the default,
/// 1M records of 128 B took the store to 1.45 times a 16 MiB budget). Records in the hash
/// logs take a 16-byte header and the key and value, each padded to 8 bytes.
fn hot_log_fitting_index(options: &OpenOptions) -> u64 {
    let pad8 = |n: usize| n.div_ceil(8) as u64 * 8;
    let record_bytes = 16 + pad8(options.key_bytes) + pad8(options.value_bytes);
    let buckets = 1u64 << (options.budget_bytes / 6 / 64).max(1).ilog2();
    (buckets * 4 * record_bytes).max(1 << 20)
}

impl Engine for BfdbHash {
    fn mode(&self) -> String {
        self.mode.clone()
    }
    fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }
    fn insert(&self, key: &[u8], value: &[u8]) -> EngineResult<()> {
        self.store
            .insert_with(key, value, self.durability)
            .map_err(|e| e.to_string())
    }
    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> EngineResult<bool> {
        match self.store.get(key).map_err(|e| e.to_string())? {
            Some(v) => {
                out.clear();
                out.extend_from_slice(&v);
                Ok(true)
            }
            None => Ok(false),
        }
    }
    fn get_many(&self, keys: &[Vec<u8>]) -> EngineResult<usize> {
        let found = self.store.get_many(keys).map_err(|e| e.to_string())?;
        Ok(found.iter().filter(|v| v.is_some()).count())
    }
    fn scan(&self, _start: &[u8], _count: usize) -> EngineResult<usize> {
        // The driver skips workloads with scans for this engine (`scans`).
        Err("bfdb-hash has no range scans".into())
    }
    fn load_batch(&self, records: &[(Vec<u8>, Vec<u8>)]) -> EngineResult<()> {
        if self.durability != bfdb::Durability::Synced {
            // Record by record, as the `bfdb` engine loads (a batch is logged whatever
            // the level).
            return records.iter().try_for_each(|(k, v)| self.insert(k, v));
        }
        // One log record and one wait for the disk per load batch.
        let mut batch = bfdb::WriteBatch::new();
        for (k, v) in records {
            batch.insert_hash(&self.store, k, v);
        }
        self.db
            .write_with(batch, self.durability)
            .map_err(|e| e.to_string())
    }
    /// A checkpoint: the hash store's logs flushed and synced and their extents
    /// recorded, so that a reopen replays no load.
    fn flush(&self) -> EngineResult<()> {
        self.db.checkpoint().map_err(|e| e.to_string())
    }
    fn stats(&self) -> Option<String> {
        Some(format!("{:?}; {:?}", self.store.stats(), self.db.stats()))
    }
    fn recovery(&self) -> Option<RecoveryInfo> {
        Some(bfdb_recovery(&self.db))
    }
}

// ---------------------------------------------------------------------------------------
// bf-tree, the reference implementation (crates.io `bf-tree` 0.5)

struct BfTree {
    tree: bf_tree::BfTree,
    mode: String,
    budget_bytes: u64,
    /// Largest key plus value, the size of the scan and read buffers.
    record_bytes: usize,
}

impl BfTree {
    fn open(options: &OpenOptions) -> EngineResult<BfTree> {
        // bf-tree needs a power-of-two circular buffer: the largest not above the budget.
        let budget_bytes = if options.budget_bytes.is_power_of_two() {
            options.budget_bytes
        } else {
            1 << (63 - options.budget_bytes.leading_zeros())
        };
        let mut config = bf_tree::Config::default();
        config
            .cb_size_byte(budget_bytes as usize)
            .cb_max_key_len(options.key_bytes.max(16));
        let mode = if options.in_memory {
            config.storage_backend(bf_tree::StorageBackend::Memory);
            "Memory backend (leaf pages in memory)".to_string()
        } else {
            let backend = if options.direct_io && options.bftree_io_uring {
                bf_tree::StorageBackend::IoUringBlocking
            } else if options.direct_io {
                bf_tree::StorageBackend::StdDirect
            } else {
                bf_tree::StorageBackend::Std
            };
            let mode = format!(
                "file, {backend:?}{}",
                if options.direct_io {
                    " (O_DIRECT)"
                } else {
                    " (buffered)"
                }
            );
            config
                .storage_backend(backend)
                .file_path(options.dir.join("bftree.data"));
            mode
        };
        let tree = bf_tree::BfTree::with_config(config, None).map_err(|e| format!("{e:?}"))?;
        Ok(BfTree {
            tree,
            mode,
            budget_bytes,
            record_bytes: (options.key_bytes + options.value_bytes).max(64),
        })
    }
}

impl Engine for BfTree {
    fn mode(&self) -> String {
        self.mode.clone()
    }
    fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }
    fn insert(&self, key: &[u8], value: &[u8]) -> EngineResult<()> {
        match self.tree.insert(key, value) {
            bf_tree::LeafInsertResult::Success => Ok(()),
            other => Err(format!("bf-tree insert: {other:?}")),
        }
    }
    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> EngineResult<bool> {
        // bf-tree writes into a slice and panics if it is too small: keep it large.
        if out.len() < self.record_bytes {
            out.resize(self.record_bytes, 0);
        }
        match self.tree.read(key, out) {
            bf_tree::LeafReadResult::Found(_) => Ok(true),
            bf_tree::LeafReadResult::NotFound | bf_tree::LeafReadResult::Deleted => Ok(false),
            bf_tree::LeafReadResult::InvalidKey => Err("bf-tree read: invalid key".into()),
        }
    }
    fn scan(&self, start: &[u8], count: usize) -> EngineResult<usize> {
        let mut iter = self
            .tree
            .scan_with_count(start, count, bf_tree::ScanReturnField::KeyAndValue)
            .map_err(|e| format!("bf-tree scan: {e:?}"))?;
        let mut buf = [0u8; 4096];
        let mut n = 0;
        while let Some(lens) = iter.next(&mut buf) {
            std::hint::black_box(lens);
            n += 1;
        }
        Ok(n)
    }
}

// ---------------------------------------------------------------------------------------
// RwLock<BTreeMap>: the in-memory reference

#[derive(Default)]
struct LockedBTreeMap {
    map: RwLock<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl Engine for LockedBTreeMap {
    fn mode(&self) -> String {
        "in memory (no budget)".into()
    }
    fn budget_bytes(&self) -> u64 {
        0
    }
    fn insert(&self, key: &[u8], value: &[u8]) -> EngineResult<()> {
        let mut map = self.map.write().map_err(|_| "poisoned lock")?;
        match map.get_mut(key) {
            Some(v) => {
                v.clear();
                v.extend_from_slice(value);
            }
            None => {
                map.insert(key.to_vec(), value.to_vec());
            }
        }
        Ok(())
    }
    fn get(&self, key: &[u8], out: &mut Vec<u8>) -> EngineResult<bool> {
        let map = self.map.read().map_err(|_| "poisoned lock")?;
        out.clear();
        Ok(map.get(key).map(|v| out.extend_from_slice(v)).is_some())
    }
    fn scan(&self, start: &[u8], count: usize) -> EngineResult<usize> {
        let map = self.map.read().map_err(|_| "poisoned lock")?;
        let mut n = 0;
        // Copy each record out once, into a reused buffer, as the other engines' scans
        // do (bf-tree into the caller's buffer, bfdb into its cursor's).
        let mut buf = Vec::with_capacity(4096);
        for (k, v) in map
            .range::<[u8], _>((Bound::Included(start), Bound::Unbounded))
            .take(count)
        {
            buf.clear();
            buf.extend_from_slice(k);
            buf.extend_from_slice(v);
            std::hint::black_box(&buf);
            n += 1;
        }
        Ok(n)
    }
    fn load_batch(&self, records: &[(Vec<u8>, Vec<u8>)]) -> EngineResult<()> {
        let mut map = self.map.write().map_err(|_| "poisoned lock")?;
        for (k, v) in records {
            map.insert(k.clone(), v.clone());
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// RocksDB, configured as the Bf-Tree paper did: direct reads and direct flush/compaction,
// the budget split 1/2 memtable, 1/4 block cache, 1/4 row cache (16/8/8 MiB of 32); no WAL
// at durability none (the paper's setting), the WAL written on every write at logged
// (`sync=false`: to the OS, not fsynced) and synced on every write at synced (`sync=true`;
// concurrent writers share an fsync in RocksDB's write group).
//
// `rocksdb-blob` is the same with key-value separation (RocksDB's integrated BlobDB): values
// of at least `blob_threshold_bytes()` go to blob files at flush, and blob garbage
// collection relocates the live values of the oldest blob files during compaction (the
// defaults: the oldest 25%, `blob_gc_age_cutoff`). Its cache half of the budget is one LRU
// cache that the block cache and the blob cache share, with no row cache (which would keep
// a second copy of the values the blob cache holds).

#[cfg(feature = "rocksdb")]
mod rocks {
    use super::*;

    pub struct Rocks {
        db: rocksdb::DB,
        write_options: rocksdb::WriteOptions,
        budget_bytes: u64,
        direct_io: bool,
        durability: Durability,
        /// The blob files' threshold, with key-value separation on.
        blob_min_bytes: Option<u64>,
    }

    impl Rocks {
        pub fn open(options: &OpenOptions, blob: bool) -> EngineResult<Rocks> {
            let budget = options.budget_bytes as usize;
            let mut opts = rocksdb::Options::default();
            opts.create_if_missing(true);
            opts.set_use_direct_reads(options.direct_io);
            opts.set_use_direct_io_for_flush_and_compaction(options.direct_io);
            opts.set_write_buffer_size(budget / 2);
            opts.set_db_write_buffer_size(budget / 2);
            let mut table = rocksdb::BlockBasedOptions::default();
            let blob_min_bytes = blob.then(blob_threshold_bytes);
            if let Some(min_bytes) = blob_min_bytes {
                let cache = rocksdb::Cache::new_lru_cache(budget / 2);
                table.set_block_cache(&cache);
                opts.set_blob_cache(&cache);
                opts.set_enable_blob_files(true);
                opts.set_min_blob_size(min_bytes);
                opts.set_enable_blob_gc(true);
            } else {
                opts.set_row_cache(&rocksdb::Cache::new_lru_cache(budget / 4));
                table.set_block_cache(&rocksdb::Cache::new_lru_cache(budget / 4));
            }
            // Index and filter blocks stay in the table readers, outside the budget (RocksDB's
            // default, as bfdb's and bf-tree's inner nodes are): charged to a block cache of
            // a quarter of a small budget they thrash, and every read fetches megabytes.
            table.set_bloom_filter(10.0, false);
            opts.set_block_based_table_factory(&table);
            opts.increase_parallelism(2);
            let db =
                rocksdb::DB::open(&opts, options.dir.join("rocksdb")).map_err(|e| e.to_string())?;
            let mut write_options = rocksdb::WriteOptions::default();
            match options.durability {
                Durability::None => write_options.disable_wal(true),
                Durability::Logged => write_options.set_sync(false),
                Durability::Synced => write_options.set_sync(true),
            }
            Ok(Rocks {
                db,
                write_options,
                budget_bytes: options.budget_bytes,
                direct_io: options.direct_io,
                durability: options.durability,
                blob_min_bytes,
            })
        }
    }

    impl Engine for Rocks {
        fn mode(&self) -> String {
            let wal = match self.durability {
                Durability::None => "no WAL",
                Durability::Logged => "WAL, sync=false",
                Durability::Synced => "WAL, sync=true",
            };
            let io = if self.direct_io {
                "direct reads + flush/compaction"
            } else {
                "buffered"
            };
            match self.blob_min_bytes {
                Some(min_bytes) => format!(
                    "file, {io}, {wal}, blob files for values of {min_bytes} B and more (blob \
                     GC on), memtables 1/2 of the budget, block and blob cache one LRU of 1/2"
                ),
                None => format!("file, {io}, {wal}"),
            }
        }
        fn budget_bytes(&self) -> u64 {
            self.budget_bytes
        }
        fn insert(&self, key: &[u8], value: &[u8]) -> EngineResult<()> {
            self.db
                .put_opt(key, value, &self.write_options)
                .map_err(|e| e.to_string())
        }
        fn get(&self, key: &[u8], out: &mut Vec<u8>) -> EngineResult<bool> {
            match self.db.get_pinned(key).map_err(|e| e.to_string())? {
                Some(v) => {
                    out.clear();
                    out.extend_from_slice(&v);
                    Ok(true)
                }
                None => Ok(false),
            }
        }
        fn get_many(&self, keys: &[Vec<u8>]) -> EngineResult<usize> {
            let mut found = 0;
            for value in self.db.multi_get(keys) {
                found += usize::from(value.map_err(|e| e.to_string())?.is_some());
            }
            Ok(found)
        }
        fn scan(&self, start: &[u8], count: usize) -> EngineResult<usize> {
            let mut it = self.db.raw_iterator();
            it.seek(start);
            let mut n = 0;
            while n < count && it.valid() {
                std::hint::black_box((
                    it.key().map(<[u8]>::to_vec),
                    it.value().map(<[u8]>::to_vec),
                ));
                n += 1;
                it.next();
            }
            it.status().map_err(|e| e.to_string())?;
            Ok(n)
        }
        fn load_batch(&self, records: &[(Vec<u8>, Vec<u8>)]) -> EngineResult<()> {
            let mut batch = rocksdb::WriteBatch::default();
            for (k, v) in records {
                batch.put(k, v);
            }
            self.db
                .write_opt(batch, &self.write_options)
                .map_err(|e| e.to_string())
        }
        fn flush(&self) -> EngineResult<()> {
            self.db.flush().map_err(|e| e.to_string())
        }
    }
}

// ---------------------------------------------------------------------------------------
// sled: its page cache capped at the budget; no direct IO.

#[cfg(feature = "sled")]
mod sled_engine {
    use super::*;

    pub struct Sled {
        db: sled::Db,
        budget_bytes: u64,
    }

    impl Sled {
        pub fn open(options: &OpenOptions) -> EngineResult<Sled> {
            let db = sled::Config::new()
                .path(options.dir.join("sled"))
                .cache_capacity(options.budget_bytes)
                .mode(sled::Mode::HighThroughput)
                .flush_every_ms(Some(1000))
                .open()
                .map_err(|e| e.to_string())?;
            Ok(Sled {
                db,
                budget_bytes: options.budget_bytes,
            })
        }
    }

    impl Engine for Sled {
        fn mode(&self) -> String {
            "file, buffered (no O_DIRECT in sled)".into()
        }
        fn budget_bytes(&self) -> u64 {
            self.budget_bytes
        }
        fn insert(&self, key: &[u8], value: &[u8]) -> EngineResult<()> {
            self.db
                .insert(key, value)
                .map(drop)
                .map_err(|e| e.to_string())
        }
        fn get(&self, key: &[u8], out: &mut Vec<u8>) -> EngineResult<bool> {
            match self.db.get(key).map_err(|e| e.to_string())? {
                Some(v) => {
                    out.clear();
                    out.extend_from_slice(&v);
                    Ok(true)
                }
                None => Ok(false),
            }
        }
        fn scan(&self, start: &[u8], count: usize) -> EngineResult<usize> {
            let mut n = 0;
            for record in self.db.range(start..).take(count) {
                std::hint::black_box(record.map_err(|e| e.to_string())?);
                n += 1;
            }
            Ok(n)
        }
        fn flush(&self) -> EngineResult<()> {
            self.db.flush().map(drop).map_err(|e| e.to_string())
        }
    }
}

// ---------------------------------------------------------------------------------------
// fjall 3: an LSM-tree; block cache half the budget, memtables of a quarter (the active one
// and one sealed while it flushes make the other half; fjall 3's bound on all memtables,
// `max_write_buffer_size`, is deprecated and no longer read). Durability none: the journal
// is left to fjall (`manual_journal_persist`: not even flushed to the OS per write);
// logged: flushed to the OS on every write and fsynced every 5 ms (bfdb's flush interval)
// by a thread of the driver's (fjall 3 dropped its own, `fsync_ms`); synced:
// `persist(SyncAll)` after every write.
//
// `fjall-blob` is the same keyspace with key-value separation: values of at least
// `blob_threshold_bytes()` go to blob files, uncompressed (the driver's values are random
// bytes, and bfdb compresses nothing), with fjall's default blob garbage collection.

#[cfg(feature = "fjall")]
mod fjall_engine {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    pub struct Fjall {
        db: fjall::Database,
        keyspace: fjall::Keyspace,
        budget_bytes: u64,
        durability: Durability,
        blob_threshold_bytes: Option<u64>,
        /// Logged: the thread that fsyncs the journal, and its stop flag.
        syncer: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
    }

    /// How often the logged level's thread fsyncs the journal.
    const SYNC_INTERVAL: std::time::Duration = std::time::Duration::from_millis(5);

    impl Fjall {
        pub fn open(options: &OpenOptions, blob: bool) -> EngineResult<Fjall> {
            let db = fjall::Database::builder(options.dir.join("fjall"))
                .cache_size(options.budget_bytes / 2)
                .manual_journal_persist(options.durability == Durability::None)
                .open()
                .map_err(|e| e.to_string())?;
            let blob_threshold_bytes = blob.then(blob_threshold_bytes);
            let memtable_bytes = (options.budget_bytes / 4).max(1 << 20);
            let keyspace = db
                .keyspace("ycsb", || {
                    let create =
                        fjall::KeyspaceCreateOptions::default().max_memtable_size(memtable_bytes);
                    match blob_threshold_bytes {
                        Some(bytes) => create.with_kv_separation(Some(
                            fjall::KvSeparationOptions::default()
                                .separation_threshold(bytes as u32)
                                .compression(fjall::CompressionType::None),
                        )),
                        None => create,
                    }
                })
                .map_err(|e| e.to_string())?;
            let syncer = (options.durability == Durability::Logged).then(|| {
                let stop = Arc::new(AtomicBool::new(false));
                let (db, flag) = (db.clone(), stop.clone());
                let thread = std::thread::spawn(move || {
                    while !flag.load(Ordering::Relaxed) {
                        std::thread::sleep(SYNC_INTERVAL);
                        if let Err(e) = db.persist(fjall::PersistMode::SyncAll) {
                            eprintln!("fjall: fsync of the journal failed: {e}");
                            return;
                        }
                    }
                });
                (stop, thread)
            });
            Ok(Fjall {
                db,
                keyspace,
                budget_bytes: options.budget_bytes,
                durability: options.durability,
                blob_threshold_bytes,
                syncer,
            })
        }
    }

    impl Drop for Fjall {
        fn drop(&mut self) {
            if let Some((stop, thread)) = self.syncer.take() {
                stop.store(true, Ordering::Relaxed);
                let _ = thread.join();
            }
        }
    }

    impl Engine for Fjall {
        fn mode(&self) -> String {
            let journal = match self.durability {
                Durability::None => "journal persisted manually (not per write)",
                Durability::Logged => "journal to the OS per write, fsync every 5 ms",
                Durability::Synced => "journal fsynced per write (PersistMode::SyncAll)",
            };
            let blobs = match self.blob_threshold_bytes {
                Some(bytes) => format!(", blob files for values of {bytes} B and more"),
                None => String::new(),
            };
            format!(
                "file, buffered (no O_DIRECT in fjall), {journal}{blobs}; block cache 1/2 of \
                 the budget, memtables of 1/4"
            )
        }
        fn budget_bytes(&self) -> u64 {
            self.budget_bytes
        }
        fn insert(&self, key: &[u8], value: &[u8]) -> EngineResult<()> {
            self.keyspace
                .insert(key, value)
                .map_err(|e| e.to_string())?;
            if self.durability == Durability::Synced {
                self.db
                    .persist(fjall::PersistMode::SyncAll)
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        }
        fn load_batch(&self, records: &[(Vec<u8>, Vec<u8>)]) -> EngineResult<()> {
            if self.durability != Durability::Synced {
                return records.iter().try_for_each(|(k, v)| {
                    self.keyspace
                        .insert(k.as_slice(), v.as_slice())
                        .map_err(|e| e.to_string())
                });
            }
            // One fsync per load batch, as RocksDB's and bfdb's synced loads.
            let mut batch = self
                .db
                .batch()
                .durability(Some(fjall::PersistMode::SyncAll));
            for (k, v) in records {
                batch.insert(&self.keyspace, k.as_slice(), v.as_slice());
            }
            batch.commit().map_err(|e| e.to_string())
        }
        fn get(&self, key: &[u8], out: &mut Vec<u8>) -> EngineResult<bool> {
            match self.keyspace.get(key).map_err(|e| e.to_string())? {
                Some(v) => {
                    out.clear();
                    out.extend_from_slice(&v);
                    Ok(true)
                }
                None => Ok(false),
            }
        }
        fn scan(&self, start: &[u8], count: usize) -> EngineResult<usize> {
            let mut n = 0;
            for guard in self.keyspace.range(start..).take(count) {
                std::hint::black_box(guard.into_inner().map_err(|e| e.to_string())?);
                n += 1;
            }
            Ok(n)
        }
        fn flush(&self) -> EngineResult<()> {
            self.db
                .persist(fjall::PersistMode::Buffer)
                .map_err(|e| e.to_string())
        }
    }
}

// ---------------------------------------------------------------------------------------
// redb 4: a copy-on-write B-tree; one write transaction at a time (redb's design: its write
// transactions are serialized). Durability none: `Durability::None` commits (since redb 3
// they free the pages earlier `None` commits left, so the file no longer grows without a
// durable commit), and an `Immediate` commit when the load ends (`flush`); synced:
// `Immediate` (fsynced before the commit returns). redb 4 has no `logged` level: 3.0
// removed `Durability::Eventual`, its commit without an fsync.

#[cfg(feature = "redb")]
mod redb_engine {
    use super::*;
    use redb::{ReadableDatabase, TableDefinition};

    const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("ycsb");

    pub struct Redb {
        db: redb::Database,
        budget_bytes: u64,
        durability: Durability,
    }

    fn text(e: impl std::fmt::Display) -> String {
        e.to_string()
    }

    impl Redb {
        pub fn open(options: &OpenOptions) -> EngineResult<Redb> {
            let db = redb::Database::builder()
                .set_cache_size(options.budget_bytes as usize)
                .create(options.dir.join("redb"))
                .map_err(text)?;
            let tx = db.begin_write().map_err(text)?;
            tx.open_table(TABLE).map_err(text)?;
            tx.commit().map_err(text)?;
            Ok(Redb {
                db,
                budget_bytes: options.budget_bytes,
                durability: options.durability,
            })
        }

        fn write(
            &self,
            records: &[(&[u8], &[u8])],
            durability: redb::Durability,
        ) -> EngineResult<()> {
            let mut tx = self.db.begin_write().map_err(text)?;
            tx.set_durability(durability).map_err(text)?;
            {
                let mut table = tx.open_table(TABLE).map_err(text)?;
                for (k, v) in records {
                    table.insert(*k, *v).map_err(text)?;
                }
            }
            tx.commit().map_err(text)
        }

        /// The durability of a write at the run's level.
        fn level(&self) -> redb::Durability {
            match self.durability {
                Durability::Synced => redb::Durability::Immediate,
                // `check` refuses logged for redb.
                Durability::None | Durability::Logged => redb::Durability::None,
            }
        }
    }

    impl Engine for Redb {
        fn mode(&self) -> String {
            let durability = match self.durability {
                Durability::None => "durability none (an immediate commit ends the load)",
                Durability::Logged | Durability::Synced => "durability immediate",
            };
            format!("file, buffered (no O_DIRECT in redb), {durability}; cache = the budget")
        }
        fn budget_bytes(&self) -> u64 {
            self.budget_bytes
        }
        fn insert(&self, key: &[u8], value: &[u8]) -> EngineResult<()> {
            self.write(&[(key, value)], self.level())
        }
        fn get(&self, key: &[u8], out: &mut Vec<u8>) -> EngineResult<bool> {
            let tx = self.db.begin_read().map_err(text)?;
            let table = tx.open_table(TABLE).map_err(text)?;
            match table.get(key).map_err(text)? {
                Some(v) => {
                    out.clear();
                    out.extend_from_slice(v.value());
                    Ok(true)
                }
                None => Ok(false),
            }
        }
        fn scan(&self, start: &[u8], count: usize) -> EngineResult<usize> {
            let tx = self.db.begin_read().map_err(text)?;
            let table = tx.open_table(TABLE).map_err(text)?;
            let mut n = 0;
            for record in table.range(start..).map_err(text)?.take(count) {
                let (k, v) = record.map_err(text)?;
                std::hint::black_box((k.value().to_vec(), v.value().to_vec()));
                n += 1;
            }
            Ok(n)
        }
        fn load_batch(&self, records: &[(Vec<u8>, Vec<u8>)]) -> EngineResult<()> {
            let pairs: Vec<(&[u8], &[u8])> = records
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_slice()))
                .collect();
            self.write(&pairs, self.level())
        }
        /// A durable commit of nothing: it makes the `None` commits before it durable.
        fn flush(&self) -> EngineResult<()> {
            self.write(&[], redb::Durability::Immediate)
        }
    }
}

// ---------------------------------------------------------------------------------------
// oxifaster (crates.io `oxifaster` 0.1.3): FASTER's FasterKv, a hash index over one
// HybridLog, with no cold tier and no read cache. The budget goes half to the index's
// home buckets and half to the log's pages; the index allocates overflow buckets beyond
// its home buckets when they fill, outside the budget (FASTER's index holds every key).
// Its file device has no O_DIRECT: reads and writes go through the OS page cache, which
// only --cgroup bounds. Its sessions belong to one thread each; each worker makes its own
// on first use. Its `F2Kv` is not used: it protects every session's epoch under thread
// id 0 and takes only fixed-size (`Pod`) keys and values.
//
// Under the driver 0.1.3 misbehaves (docs/benchmarks.md, "The hash tier"): reads of loaded
// keys answer "not found" in mixed workloads, and mixed workloads can hang with every
// worker looping in `read_sync`. It is here to check those findings and newer releases,
// not as a peer whose numbers can be quoted.

#[cfg(feature = "oxifaster")]
mod oxifaster_engine {
    use super::*;
    use std::cell::RefCell;
    use std::sync::Arc;

    use oxifaster::Status;
    use oxifaster::codec::RawBytes;
    use oxifaster::device::FileSystemDisk;
    use oxifaster::store::{FasterKv, FasterKvConfig, Session};

    type Store = FasterKv<RawBytes, RawBytes, FileSystemDisk>;

    thread_local! {
        /// This thread's session, made on first use and ended when the thread exits.
        static SESSION: RefCell<Option<Session<RawBytes, RawBytes, FileSystemDisk>>> =
            const { RefCell::new(None) };
    }

    /// Tries of a read that the store answers `Pending` (a disk read), each after
    /// `complete_pending(true)`, before the driver reports an error.
    const PENDING_TRIES: usize = 1000;

    pub struct Oxifaster {
        store: Arc<Store>,
        budget_bytes: u64,
        mode: String,
    }

    fn text(status: Status) -> String {
        format!("oxifaster: {status:?}")
    }

    impl Oxifaster {
        pub fn open(options: &OpenOptions) -> EngineResult<Oxifaster> {
            let budget = options.budget_bytes;
            // Home buckets of 64 bytes, a power of two of them, in half the budget.
            let buckets = 1u64 << (budget / 2 / 64).max(1).ilog2();
            let log_memory_bytes = budget - buckets * 64;
            // Pages of about a sixteenth of the log's memory, 4 KiB to 4 MiB.
            let page_bits = (log_memory_bytes / 16).max(1).ilog2().clamp(12, 22);
            let config = FasterKvConfig {
                table_size: buckets,
                log_memory_size: log_memory_bytes,
                page_size_bits: page_bits,
                mutable_fraction: 0.9,
            };
            let device = FileSystemDisk::single_file(options.dir.join("oxifaster.log"))
                .map_err(|e| e.to_string())?;
            let store = Arc::new(FasterKv::new(config, device));
            let mode = format!(
                "FasterKv (hash index and HybridLog; no cold tier, no read cache, no log of \
                 writes); memory: index {buckets} home buckets ({:.1} MiB; overflow buckets \
                 outside the budget), log {:.1} MiB in {} KiB pages; one file, buffered IO \
                 (no O_DIRECT in oxifaster)",
                (buckets * 64) as f64 / (1 << 20) as f64,
                log_memory_bytes as f64 / (1 << 20) as f64,
                (1u64 << page_bits) >> 10
            );
            Ok(Oxifaster {
                store,
                budget_bytes: budget,
                mode,
            })
        }

        /// Runs `f` with this thread's session of the store.
        fn with_session<T>(
            &self,
            f: impl FnOnce(&mut Session<RawBytes, RawBytes, FileSystemDisk>) -> EngineResult<T>,
        ) -> EngineResult<T> {
            SESSION.with(|cell| {
                let mut slot = cell.borrow_mut();
                let session = match &mut *slot {
                    Some(session) => session,
                    None => slot.insert(self.store.start_session().map_err(text)?),
                };
                f(session)
            })
        }
    }

    impl Engine for Oxifaster {
        fn mode(&self) -> String {
            self.mode.clone()
        }
        fn budget_bytes(&self) -> u64 {
            self.budget_bytes
        }
        fn insert(&self, key: &[u8], value: &[u8]) -> EngineResult<()> {
            let (key, value) = (RawBytes::from(key.to_vec()), RawBytes::from(value.to_vec()));
            self.with_session(|session| {
                for _ in 0..PENDING_TRIES {
                    match session.upsert(key.clone(), value.clone()) {
                        Status::Ok => return Ok(()),
                        Status::Pending => {
                            session.complete_pending(true);
                            return Ok(());
                        }
                        // The log's next page is not free yet (its flush has not
                        // completed): oxifaster returns instead of waiting.
                        Status::OutOfMemory => {
                            session.refresh();
                            std::thread::yield_now();
                        }
                        other => return Err(text(other)),
                    }
                }
                Err(format!(
                    "oxifaster: an upsert still out of memory after {PENDING_TRIES} tries"
                ))
            })
        }
        fn get(&self, key: &[u8], out: &mut Vec<u8>) -> EngineResult<bool> {
            let key = RawBytes::from(key.to_vec());
            self.with_session(|session| {
                for _ in 0..PENDING_TRIES {
                    match session.read(&key) {
                        Ok(Some(value)) => {
                            out.clear();
                            out.extend_from_slice(&value.0);
                            return Ok(true);
                        }
                        Ok(None) => return Ok(false),
                        Err(Status::Pending) => {
                            session.complete_pending(true);
                        }
                        Err(other) => return Err(text(other)),
                    }
                }
                Err(format!(
                    "oxifaster: a read still pending after {PENDING_TRIES} tries"
                ))
            })
        }
        fn scan(&self, _start: &[u8], _count: usize) -> EngineResult<usize> {
            // The driver skips workloads with scans for this engine (`scans`).
            Err("oxifaster has no range scans".into())
        }
        fn stats(&self) -> Option<String> {
            Some(format!(
                "{:?}; {:?}",
                self.store.index_stats(),
                self.store.log_stats()
            ))
        }
    }
}
