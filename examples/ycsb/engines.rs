//! The engines compared, behind one small trait. Each opens with a memory budget and a
//! directory of its own; the driver never looks inside them.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

/// Errors of an engine, as text: the driver only reports them.
pub type EngineResult<T> = Result<T, String>;

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
    pub key_bytes: usize,
    pub value_bytes: usize,
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
}

/// The engines the driver knows, including those behind cargo features.
pub const ENGINE_NAMES: &[&str] = &[
    "bfdb", "bftree", "btreemap", "rocksdb", "sled", "fjall", "redb",
];

/// Opens the engine called `name`.
pub fn open(name: &str, options: &OpenOptions) -> EngineResult<Box<dyn Engine>> {
    std::fs::create_dir_all(&options.dir)
        .map_err(|e| format!("cannot create {}: {e}", options.dir.display()))?;
    match name {
        "bfdb" => Ok(Box::new(Bfdb::open(options)?)),
        "bftree" => Ok(Box::new(BfTree::open(options)?)),
        "btreemap" => Ok(Box::new(LockedBTreeMap::default())),
        #[cfg(feature = "rocksdb")]
        "rocksdb" => Ok(Box::new(rocks::Rocks::open(options)?)),
        #[cfg(feature = "sled")]
        "sled" => Ok(Box::new(sled_engine::Sled::open(options)?)),
        #[cfg(feature = "fjall")]
        "fjall" => Ok(Box::new(fjall_engine::Fjall::open(options)?)),
        #[cfg(feature = "redb")]
        "redb" => Ok(Box::new(redb_engine::Redb::open(options)?)),
        other if ENGINE_NAMES.contains(&other) => Err(format!(
            "engine {other} is behind the cargo feature of the same name: \
             cargo run --release --example ycsb --features {other} -- ..."
        )),
        other => Err(format!(
            "unknown engine {other}; known: {}",
            ENGINE_NAMES.join(", ")
        )),
    }
}

/// Bytes of the files under `dir` (apparent sizes), 0 if it does not exist.
pub fn dir_size_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
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

impl Bfdb {
    fn open(options: &OpenOptions) -> EngineResult<Bfdb> {
        let config = bfdb::Config {
            memory_budget_bytes: options.budget_bytes,
            backend: bfdb_backend(options),
            ..bfdb::Config::default()
        };
        let tree = if options.in_memory {
            bfdb::Tree::in_memory(config)
        } else {
            bfdb::Tree::open(options.dir.join("bfdb.tree"), config)
        }
        .map_err(|e| e.to_string())?;
        // Name the backend that is active, not the one asked for (`Auto` resolves to
        // io_uring or pread), and any fallback the tree reported.
        let stats = tree.stats();
        let notice = stats
            .backend_notice
            .as_deref()
            .map_or(String::new(), |n| format!("; {n}"));
        let mode = if options.in_memory {
            "leaf pages in memory".to_string()
        } else if stats.direct_io {
            format!("file, {} with O_DIRECT{notice}", stats.backend)
        } else if options.direct_io {
            format!(
                "file, {} buffered (O_DIRECT refused){notice}",
                stats.backend
            )
        } else {
            format!("file, {} buffered", stats.backend)
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
// no WAL, the budget split 1/2 memtable, 1/4 block cache, 1/4 row cache (16/8/8 MiB of 32).

#[cfg(feature = "rocksdb")]
mod rocks {
    use super::*;

    pub struct Rocks {
        db: rocksdb::DB,
        write_options: rocksdb::WriteOptions,
        budget_bytes: u64,
        direct_io: bool,
    }

    impl Rocks {
        pub fn open(options: &OpenOptions) -> EngineResult<Rocks> {
            let budget = options.budget_bytes as usize;
            let mut opts = rocksdb::Options::default();
            opts.create_if_missing(true);
            opts.set_use_direct_reads(options.direct_io);
            opts.set_use_direct_io_for_flush_and_compaction(options.direct_io);
            opts.set_write_buffer_size(budget / 2);
            opts.set_db_write_buffer_size(budget / 2);
            opts.set_row_cache(&rocksdb::Cache::new_lru_cache(budget / 4));
            let mut table = rocksdb::BlockBasedOptions::default();
            table.set_block_cache(&rocksdb::Cache::new_lru_cache(budget / 4));
            // Index and filter blocks stay in the table readers, outside the budget (RocksDB's
            // default, as bfdb's and bf-tree's inner nodes are): charged to a block cache of
            // a quarter of a small budget they thrash, and every read fetches megabytes.
            table.set_bloom_filter(10.0, false);
            opts.set_block_based_table_factory(&table);
            opts.increase_parallelism(2);
            let db =
                rocksdb::DB::open(&opts, options.dir.join("rocksdb")).map_err(|e| e.to_string())?;
            let mut write_options = rocksdb::WriteOptions::default();
            write_options.disable_wal(true);
            Ok(Rocks {
                db,
                write_options,
                budget_bytes: options.budget_bytes,
                direct_io: options.direct_io,
            })
        }
    }

    impl Engine for Rocks {
        fn mode(&self) -> String {
            if self.direct_io {
                "file, direct reads + flush/compaction, no WAL".into()
            } else {
                "file, buffered, no WAL".into()
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
// fjall: an LSM-tree; block cache = the budget, journal not fsynced per write.

#[cfg(feature = "fjall")]
mod fjall_engine {
    use super::*;

    pub struct Fjall {
        keyspace: fjall::Keyspace,
        partition: fjall::PartitionHandle,
        budget_bytes: u64,
    }

    impl Fjall {
        pub fn open(options: &OpenOptions) -> EngineResult<Fjall> {
            // Half the budget caches blocks; the other half bounds the write buffers, as
            // RocksDB's memtable share does (fjall refuses write buffers below 1 MiB).
            let keyspace = fjall::Config::new(options.dir.join("fjall"))
                .cache_size(options.budget_bytes / 2)
                .max_write_buffer_size((options.budget_bytes / 2).max(1 << 20))
                .manual_journal_persist(true)
                .open()
                .map_err(|e| e.to_string())?;
            let partition = keyspace
                .open_partition("ycsb", fjall::PartitionCreateOptions::default())
                .map_err(|e| e.to_string())?;
            Ok(Fjall {
                keyspace,
                partition,
                budget_bytes: options.budget_bytes,
            })
        }
    }

    impl Engine for Fjall {
        fn mode(&self) -> String {
            "file, buffered (no O_DIRECT in fjall), journal not fsynced".into()
        }
        fn budget_bytes(&self) -> u64 {
            self.budget_bytes
        }
        fn insert(&self, key: &[u8], value: &[u8]) -> EngineResult<()> {
            self.partition.insert(key, value).map_err(|e| e.to_string())
        }
        fn get(&self, key: &[u8], out: &mut Vec<u8>) -> EngineResult<bool> {
            match self.partition.get(key).map_err(|e| e.to_string())? {
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
            for record in self.partition.range(start..).take(count) {
                std::hint::black_box(record.map_err(|e| e.to_string())?);
                n += 1;
            }
            Ok(n)
        }
        fn flush(&self) -> EngineResult<()> {
            self.keyspace
                .persist(fjall::PersistMode::Buffer)
                .map_err(|e| e.to_string())
        }
    }
}

// ---------------------------------------------------------------------------------------
// redb: a copy-on-write B-tree; one write transaction at a time, durability mostly off.

#[cfg(feature = "redb")]
mod redb_engine {
    use super::*;
    use redb::TableDefinition;

    const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("ycsb");

    pub struct Redb {
        db: redb::Database,
        budget_bytes: u64,
        commits: std::sync::atomic::AtomicU64,
    }

    /// One commit in this many is `Durability::Eventual`: redb frees pages only in commits
    /// above `Durability::None`, so with `None` alone the file grows by gigabytes.
    const EVENTUAL_EVERY: u64 = 1000;

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
                commits: std::sync::atomic::AtomicU64::new(0),
            })
        }

        fn write(&self, records: &[(&[u8], &[u8])]) -> EngineResult<()> {
            let mut tx = self.db.begin_write().map_err(text)?;
            let n = self
                .commits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // Load batches and one commit in EVENTUAL_EVERY free the pages earlier commits
            // left behind.
            tx.set_durability(if records.len() > 1 || n.is_multiple_of(EVENTUAL_EVERY) {
                redb::Durability::Eventual
            } else {
                redb::Durability::None
            });
            {
                let mut table = tx.open_table(TABLE).map_err(text)?;
                for (k, v) in records {
                    table.insert(*k, *v).map_err(text)?;
                }
            }
            tx.commit().map_err(text)
        }
    }

    impl Engine for Redb {
        fn mode(&self) -> String {
            "file, buffered (no O_DIRECT in redb), durability none (eventual every 1000 commits)"
                .into()
        }
        fn budget_bytes(&self) -> u64 {
            self.budget_bytes
        }
        fn insert(&self, key: &[u8], value: &[u8]) -> EngineResult<()> {
            self.write(&[(key, value)])
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
            self.write(&pairs)
        }
    }
}
