//! Criterion benchmarks for the in-memory `Tree`'s hot paths: point reads, upserts, inserts
//! of new keys and short range scans, single-threaded, with 16-byte keys and values.
//! (Node search, mini-page insert and pool alloc/evict are in `benches/foundation.rs`.)
//!
//! Run with `cargo bench --bench tree`. These measure; no test asserts a timing.

use std::hint::black_box;

use bfdb::{Config, Tree};
use criterion::{Criterion, criterion_group, criterion_main};

/// Records loaded before measuring: about 3 MiB of raw data, well inside the budget.
const RECORDS: u64 = 100_000;

/// A bijective scramble, so consecutive indexes land on different leaf pages.
fn scramble(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x6A09_E667_F3BC_C909);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The YCSB-style key of record `i`: a shared prefix, then the scrambled index.
fn key(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(b"user0000");
    k[8..].copy_from_slice(&scramble(i).to_be_bytes());
    k
}

fn loaded_tree() -> Tree {
    let tree = Tree::in_memory(Config {
        memory_budget_bytes: 64 << 20,
        ..Config::default()
    })
    .expect("a valid config");
    for i in 0..RECORDS {
        tree.insert(&key(i), &i.to_le_bytes().repeat(2))
            .expect("insert");
    }
    tree
}

fn tree_ops(c: &mut Criterion) {
    let tree = loaded_tree();
    let mut out = Vec::with_capacity(64);
    // A stride coprime with RECORDS walks every record in a cache-unfriendly order.
    let mut i = 0u64;
    c.bench_function("tree/get hit (100K records in memory)", |b| {
        b.iter(|| {
            i = (i + 7919) % RECORDS;
            black_box(tree.get_into(black_box(&key(i)), &mut out).expect("get"))
        })
    });
    c.bench_function("tree/get miss", |b| {
        b.iter(|| {
            i = (i + 7919) % RECORDS;
            black_box(
                tree.get_into(black_box(&key(RECORDS + i)), &mut out)
                    .expect("get"),
            )
        })
    });
    let mut version = 0u64;
    c.bench_function("tree/insert, replacing an existing record", |b| {
        b.iter(|| {
            i = (i + 7919) % RECORDS;
            version += 1;
            tree.insert(black_box(&key(i)), &version.to_le_bytes().repeat(2))
                .expect("insert")
        })
    });
    let mut fresh = RECORDS * 2;
    c.bench_function("tree/insert of a new key (the tree grows)", |b| {
        b.iter(|| {
            fresh += 1;
            tree.insert(black_box(&key(fresh)), &fresh.to_le_bytes().repeat(2))
                .expect("insert")
        })
    });
    c.bench_function("tree/range of 32 records", |b| {
        b.iter(|| {
            i = (i + 7919) % RECORDS;
            let n = tree
                .range(&key(i)[..]..)
                .take(32)
                .map(|r| r.expect("scan").1.len())
                .sum::<usize>();
            black_box(n)
        })
    });
}

criterion_group! {
    name = benches;
    // Short runs: the insert benchmark grows the tree by every iteration it measures.
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = tree_ops
}
criterion_main!(benches);
