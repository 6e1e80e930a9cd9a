//! The foundation at work: records written by several threads into mini-pages in the
//! circular-buffer pool, merged into checksummed 4 KiB leaf pages in a file when the
//! pool evicts them, then read back and verified — before and after reopening the file.
//!
//! There is no tree yet (that is the next issue), so records are spread over a fixed set of
//! buckets by hash; each bucket is one leaf page with at most one mini-page, exactly the
//! pairing the Bf-Tree's mapping table maintains. The write path is the paper's: insert
//! into the mini-page, grow it by doubling when full, merge it into the leaf page when it
//! reaches the largest size or when the pool evicts it.
//!
//! Run: `cargo run --release --example foundation [-- --records N --pool-kib K --threads T]`.
//! `--small` runs a quick smoke test (used by CI).

use std::path::Path;
use std::time::Instant;

use bfdb::pool::{AllocError, Block, EvictDecision, Pool, PoolConfig};
use bfdb::storage::{FileOptions, FileStore, Page, PageNo, PageStore};
use bfdb::tree::node::{Fences, NodeKind, NodeMut, NodeRef, RecordType, WriteError};
use parking_lot::Mutex;

const KEY_BYTES: usize = 16;
const VALUE_BYTES: usize = 16;
/// Every mini-page starts with the index of the bucket that owns it, so the eviction
/// callback can find its owner from the block alone.
const OWNER_BYTES: usize = 8;
/// Buckets are sized so that a leaf page stays well below full (there is no split here).
const TARGET_LEAF_FILL_BYTES: usize = 2400;
/// The largest mini-page, the pool's largest block.
const MAX_MINI_BYTES: u64 = 4096;

struct Options {
    records: u64,
    pool_bytes: u64,
    threads: usize,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        records: 200_000,
        pool_bytes: 1 << 20,
        threads: 4,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<u64, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match arg.as_str() {
            "--records" => options.records = number("--records")?,
            "--pool-kib" => options.pool_bytes = number("--pool-kib")? << 10,
            "--threads" => options.threads = number("--threads")?.max(1) as usize,
            "--small" => {
                options.records = 20_000;
                options.pool_bytes = 256 << 10;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(options)
}

fn key(i: u64) -> [u8; KEY_BYTES] {
    let mut k = [0u8; KEY_BYTES];
    k[..8].copy_from_slice(b"user0000");
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

fn value(i: u64) -> [u8; VALUE_BYTES] {
    let mut v = [0u8; VALUE_BYTES];
    v[..8].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
    v[8..].copy_from_slice(&(!i).to_le_bytes());
    v
}

fn bucket_of(i: u64, buckets: usize) -> usize {
    (i.wrapping_mul(0xff51_afd7_ed55_8ccd) >> 32) as usize % buckets
}

/// One leaf page and, while it is hot, its mini-page.
struct Bucket {
    leaf: PageNo,
    mini: Option<Block>,
}

struct Engine {
    pool: Pool,
    store: FileStore,
    buckets: Vec<Mutex<Bucket>>,
}

fn io_err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl Engine {
    /// Merges the dirty records of `mini` into `leaf` and writes the leaf page.
    fn merge(&self, leaf: PageNo, mini: NodeRef<'_>) -> std::io::Result<()> {
        let mut page = Page::boxed();
        self.store.read_page(leaf, &mut page)?;
        // Bytes from disk are validated before they are trusted.
        NodeRef::parse(page.payload()).map_err(io_err)?;
        let mut node = NodeMut::trusted(page.payload_mut());
        for record in mini.iter().filter(|r| r.record_type().is_dirty()) {
            let k = record.key();
            match record.record_type() {
                RecordType::Tombstone => {
                    if let Ok(i) = node.as_ref().search(&k) {
                        node.remove(i);
                    }
                }
                _ => {
                    node.upsert(&k, record.value(), RecordType::Insert)
                        .map_err(|e| io_err(format!("leaf page {leaf} overflowed: {e:?}")))?;
                }
            }
        }
        self.store.write_page(leaf, &mut page)
    }

    /// The eviction callback: try-lock the owner, merge, detach. Never blocks.
    fn evict(&self, block: &Block) -> EvictDecision {
        // SAFETY: the block is `Evicting`: if its owner frees it meanwhile it only becomes
        // `Dead`, whose memory the pool does not reuse before we return; the owner index
        // was written before the block was published and never changes.
        let owner = unsafe { block.payload() }[..OWNER_BYTES]
            .try_into()
            .map(u64::from_le_bytes)
            .expect("8 bytes");
        let Some(mut bucket) = self.buckets[owner as usize].try_lock() else {
            return EvictDecision::Busy;
        };
        if bucket.mini != Some(*block) {
            // Between the pool's claim and our lock, the owner replaced its mini-page
            // (it grew) and freed this block, which is now `Dead`: the pool reclaims it
            // when we answer `Busy`. Batched eviction claims several blocks before it
            // calls back, which widens this window.
            return EvictDecision::Busy;
        }
        // SAFETY: we hold the owner's lock, the only way to reach this mini-page.
        let bytes = unsafe { block.payload() };
        let mini = NodeRef::trusted(&bytes[OWNER_BYTES..]);
        if let Err(e) = self.merge(bucket.leaf, mini) {
            eprintln!("eviction of bucket {owner} failed: {e}");
            return EvictDecision::Busy;
        }
        bucket.mini = None;
        EvictDecision::Evicted
    }

    fn insert(&self, i: u64) -> std::io::Result<()> {
        let b = bucket_of(i, self.buckets.len());
        let (k, v) = (key(i), value(i));
        loop {
            let mut bucket = self.buckets[b].lock();
            match self.try_insert(&mut bucket, b, &k, &v)? {
                true => return Ok(()),
                // The pool could not make room without this bucket's own lock, or while
                // other buckets are busy merging: release it, let them finish, try again,
                // as the tree's restart path will.
                false => {
                    drop(bucket);
                    // Help eviction while holding no lock: the block stuck at the head may
                    // be this bucket's own mini-page, which no one can evict while we
                    // hold the bucket.
                    let evictor = |block: &Block| self.evict(block);
                    if !self.pool.evict_until(MAX_MINI_BYTES, &evictor) {
                        std::thread::yield_now();
                    }
                }
            }
        }
    }

    /// Inserts under the bucket lock; `Ok(false)` means "drop the lock and retry".
    fn try_insert(
        &self,
        bucket: &mut Bucket,
        owner: usize,
        k: &[u8],
        v: &[u8],
    ) -> std::io::Result<bool> {
        let evictor = |block: &Block| self.evict(block);
        loop {
            let Some(block) = bucket.mini else {
                let Some(block) = self.alloc_mini(64, owner, None, &evictor)? else {
                    return Ok(false);
                };
                bucket.mini = Some(block);
                continue;
            };
            // SAFETY: we hold the bucket lock, which owns the mini-page exclusively.
            let bytes = unsafe { block.payload_mut() };
            let mut mini = NodeMut::trusted(&mut bytes[OWNER_BYTES..]);
            match mini.upsert(k, v, RecordType::Insert) {
                Ok(_) => return Ok(true),
                Err(WriteError::Full) => {}
                Err(e) => return Err(io_err(format!("{e:?}"))),
            }
            if block.size_bytes() < self.pool.max_block_size_bytes() {
                // Grow by doubling: read-copy-update into a new block, free the old one.
                let Some(bigger) =
                    self.alloc_mini(block.size_bytes() * 2, owner, Some(mini.as_ref()), &evictor)?
                else {
                    return Ok(false);
                };
                bucket.mini = Some(bigger);
                // SAFETY: the old block is unreachable now (the bucket points at the new
                // one) and we hold the only lock through which it was reached.
                unsafe { self.pool.free(block) };
            } else {
                // Full at the largest size: merge the dirty records into the leaf page.
                self.merge(bucket.leaf, mini.as_ref())?;
                mini.clear();
            }
        }
    }

    /// Allocates a mini-page of `size` payload bytes for `owner`, copying `from` into it.
    /// `Ok(None)` means the pool asked us to release our lock and restart.
    fn alloc_mini(
        &self,
        size: usize,
        owner: usize,
        from: Option<NodeRef<'_>>,
        evictor: &dyn bfdb::pool::Evictor,
    ) -> std::io::Result<Option<Block>> {
        let block = match self.pool.alloc(size, evictor) {
            Ok(block) => block,
            Err(AllocError::WouldBlock) => return Ok(None),
            Err(e) => return Err(io_err(e)),
        };
        // SAFETY: a freshly allocated (Reserved) block is ours alone until published.
        let bytes = unsafe { block.payload_mut() };
        bytes[..OWNER_BYTES].copy_from_slice(&(owner as u64).to_le_bytes());
        let node = &mut bytes[OWNER_BYTES..];
        match from {
            Some(old) => {
                bfdb::tree::node::copy_into(&old, node, Fences::None, |_| true)
                    .map_err(|e| io_err(format!("{e:?}")))?;
            }
            None => {
                NodeMut::init(node, NodeKind::Mini, Fences::None).map_err(io_err)?;
            }
        }
        // SAFETY: the payload is initialised and the caller links it to its bucket
        // before releasing the bucket lock, which the evictor must take first.
        unsafe { self.pool.publish(&block) };
        Ok(Some(block))
    }

    /// Reads record `i` from its mini-page if present, else from its leaf page.
    fn get(&self, i: u64, page: &mut Page) -> std::io::Result<Option<Vec<u8>>> {
        let bucket = self.buckets[bucket_of(i, self.buckets.len())].lock();
        let k = key(i);
        if let Some(block) = bucket.mini {
            // SAFETY: the bucket lock is held, so nobody modifies or frees the block.
            let mini = NodeRef::trusted(&unsafe { block.payload() }[OWNER_BYTES..]);
            if let Ok(at) = mini.search(&k) {
                let r = mini.record(at);
                return Ok(r.record_type().exists().then(|| r.value().to_vec()));
            }
        }
        self.store.read_page(bucket.leaf, page)?;
        let leaf = NodeRef::parse(page.payload()).map_err(io_err)?;
        Ok(leaf.search(&k).ok().map(|at| leaf.value(at).to_vec()))
    }
}

fn verify_all(records: u64, read: impl Fn(u64, &mut Page) -> std::io::Result<Option<Vec<u8>>>) {
    let mut page = Page::boxed();
    for i in 0..records {
        let got = read(i, &mut page).expect("read");
        assert_eq!(got.as_deref(), Some(&value(i)[..]), "record {i}");
    }
}

fn run(options: &Options, path: &Path) -> std::io::Result<()> {
    let buckets = ((options.records as usize * (KEY_BYTES + VALUE_BYTES + 8))
        / TARGET_LEAF_FILL_BYTES)
        .max(1);
    let store = FileStore::open(path, FileOptions::default().direct_io(true))?;
    let mut leaves = Vec::with_capacity(buckets);
    let mut page = Page::boxed();
    NodeMut::init(page.payload_mut(), NodeKind::Leaf, Fences::None).map_err(io_err)?;
    for _ in 0..buckets {
        let no = store.allocate()?;
        store.write_page(no, &mut page)?;
        leaves.push(no);
    }
    store.sync()?;
    let pool = Pool::new(PoolConfig::with_capacity(options.pool_bytes)).map_err(io_err)?;
    let engine = Engine {
        pool,
        buckets: leaves
            .iter()
            .map(|&leaf| Mutex::new(Bucket { leaf, mini: None }))
            .collect(),
        store,
    };
    println!(
        "bfdb foundation: {} records of {KEY_BYTES}+{VALUE_BYTES} bytes, {buckets} leaf pages, \
         {} KiB pool ({:?}), O_DIRECT {}, {} threads",
        options.records,
        options.pool_bytes >> 10,
        engine.pool.backing(),
        if engine.store.direct_io_active() {
            "on"
        } else {
            "off"
        },
        options.threads,
    );

    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..options.threads as u64 {
            let engine = &engine;
            s.spawn(move || {
                let mut i = t;
                while i < options.records {
                    engine.insert(i).expect("insert");
                    i += options.threads as u64;
                }
            });
        }
    });
    let load = started.elapsed();
    let stats = engine.pool.stats();
    println!(
        "load: {:.0} inserts/s ({:.2?}); pool: {} tail + {} free-list allocations, {} evictions, \
         {} busy retries",
        options.records as f64 / load.as_secs_f64(),
        load,
        stats.allocs_from_tail,
        stats.allocs_from_free_list,
        stats.evictions,
        stats.busy_retries,
    );

    let started = Instant::now();
    verify_all(options.records, |i, page| engine.get(i, page));
    println!(
        "read back {} records through mini-pages and leaf pages in {:.2?}: all correct",
        options.records,
        started.elapsed()
    );

    let evictor = |block: &Block| engine.evict(block);
    let drained = engine.pool.drain(&evictor);
    engine.store.sync()?;
    println!(
        "drained the pool ({drained:?}); file is {} KiB for {} KiB of raw records",
        engine.store.size_bytes() >> 10,
        (options.records * (KEY_BYTES + VALUE_BYTES) as u64) >> 10,
    );
    drop(engine);

    // Reopen the file: every record must come back from the leaf pages alone.
    let store = FileStore::open(path, FileOptions::default().create(false).direct_io(true))?;
    let started = Instant::now();
    verify_all(options.records, |i, page| {
        store.read_page(leaves[bucket_of(i, leaves.len())], page)?;
        let leaf = NodeRef::parse(page.payload()).map_err(io_err)?;
        Ok(leaf.search(&key(i)).ok().map(|at| leaf.value(at).to_vec()))
    });
    println!(
        "reopened the file and read back {} records from {} leaf pages in {:.2?}: all correct",
        options.records,
        store.stats().live_pages,
        started.elapsed()
    );
    Ok(())
}

fn main() {
    let options = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "{e}\nusage: foundation [--records N] [--pool-kib K] [--threads T] [--small]"
            );
            std::process::exit(2);
        }
    };
    // Under target/ on the work disk rather than /tmp (often a tmpfs), so O_DIRECT is
    // exercised where the filesystem allows it.
    let parent = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&parent).expect("target directory");
    let dir = tempfile::tempdir_in(parent).expect("temporary directory");
    if let Err(e) = run(&options, &dir.path().join("foundation.bfdb")) {
        eprintln!("failed: {e}");
        std::process::exit(1);
    }
}
