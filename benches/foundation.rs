//! Criterion benchmarks for the foundation's hot paths: node search, mini-page insert,
//! pool allocation and eviction, and page-store round trips.
//!
//! Run with `cargo bench --bench foundation`. These measure; no test asserts a timing.

use std::hint::black_box;

use bfdb::pool::{Block, EvictDecision, Evictor, Pool, PoolConfig};
use bfdb::storage::{MemoryStore, Page, PageNo, PageStore};
use bfdb::tree::node::{Fences, NodeKind, NodeMut, NodeRef, RecordType};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

/// 16-byte keys with a shared 8-byte prefix, like the YCSB keys the paper measures.
fn key(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(b"user0000");
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

/// A full 4080-byte leaf node of 16-byte keys and 16-byte values.
fn full_leaf(buf: &mut [u8]) -> usize {
    let low = key(0);
    let high = key(u64::MAX);
    let mut node = NodeMut::init(
        buf,
        NodeKind::Leaf,
        Fences::Range {
            low: Some(&low),
            high: Some(&high),
        },
    )
    .expect("a 4080-byte buffer holds a node");
    let mut n = 0;
    while node
        .push(&key(n * 2 + 1), &[7u8; 16], RecordType::Insert)
        .is_ok()
    {
        n += 1;
    }
    n as usize
}

fn node_search(c: &mut Criterion) {
    let mut buf = vec![0u8; 4080];
    let records = full_leaf(&mut buf);
    let node = NodeRef::parse(&buf).expect("valid");
    let mut i = 0u64;
    c.bench_function(&format!("node/search hit ({records} records)"), |b| {
        b.iter(|| {
            i = (i + 7919) % records as u64;
            black_box(node.search(black_box(&key(i * 2 + 1))))
        })
    });
    c.bench_function("node/search miss", |b| {
        b.iter(|| {
            i = (i + 7919) % records as u64;
            black_box(node.search(black_box(&key(i * 2))))
        })
    });
    c.bench_function("node/parse (validate a 4 KiB leaf)", |b| {
        b.iter(|| black_box(NodeRef::parse(black_box(&buf)).is_ok()))
    });
}

fn mini_page_insert(c: &mut Criterion) {
    // Fill a 1 KiB mini-page with random-order inserts, as writes into a hot leaf do.
    let order: Vec<u64> = (0..64u64).map(|i| (i * 37) % 64).collect();
    c.bench_function("mini-page/insert 1 KiB until full", |b| {
        b.iter_batched_ref(
            || vec![0u8; 1024],
            |buf| {
                let mut node =
                    NodeMut::init(buf, NodeKind::Mini, Fences::Prefix(b"user0000")).expect("node");
                let mut inserted = 0;
                for &i in &order {
                    if node
                        .insert(&key(i), &[1u8; 16], RecordType::Insert)
                        .is_err()
                    {
                        break;
                    }
                    inserted += 1;
                }
                black_box(inserted)
            },
            BatchSize::SmallInput,
        )
    });
}

/// Evicts everything it is offered, as a tree with no page held would.
struct EvictAll;

impl Evictor for EvictAll {
    fn evict(&self, _block: &Block) -> EvictDecision {
        EvictDecision::Evicted
    }
}

fn pool_alloc_evict(c: &mut Criterion) {
    let pool = Pool::new(PoolConfig::with_capacity(4 << 20)).expect("pool");
    let sizes = [64usize, 128, 256, 512, 1024, 2048, 4096];
    let mut n = 0usize;
    c.bench_function("pool/alloc+publish+free (free-list reuse)", |b| {
        b.iter(|| {
            n += 1;
            let block = pool
                .alloc(sizes[n % sizes.len()], &EvictAll)
                .expect("alloc");
            // SAFETY: the block was just allocated and is reachable only through `block`.
            unsafe {
                pool.publish(&block);
                pool.free(block);
            }
        })
    });
    let pool = Pool::new(PoolConfig::with_capacity(4 << 20)).expect("pool");
    c.bench_function("pool/alloc+publish, evicting at the head when full", |b| {
        b.iter(|| {
            n += 1;
            let block = pool
                .alloc(sizes[n % sizes.len()], &EvictAll)
                .expect("alloc");
            // SAFETY: the block was just allocated; nothing else refers to it.
            unsafe { pool.publish(&block) };
            black_box(block.offset())
        })
    });
}

fn page_store(c: &mut Criterion) {
    let store = MemoryStore::new();
    let pages: Vec<PageNo> = (0..64).map(|_| store.allocate().expect("alloc")).collect();
    let mut page = Page::boxed();
    let mut i = 0;
    c.bench_function("storage/memory write+read (checksummed 4 KiB)", |b| {
        b.iter(|| {
            i = (i + 1) % pages.len();
            store.write_page(pages[i], &mut page).expect("write");
            store.read_page(pages[i], &mut page).expect("read");
        })
    });
}

criterion_group!(
    benches,
    node_search,
    mini_page_insert,
    pool_alloc_evict,
    page_store
);
criterion_main!(benches);
