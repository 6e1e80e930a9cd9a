//! Measures the Tree's queue-depth mechanisms (the queue-depth section of
//! docs/design.md) on a file ten times its memory budget: a loop of `get` against
//! `get_many`, scans with and without read-ahead, and random upserts with and without
//! batched eviction IO.
//!
//! ```text
//! cargo run --release --example treeio -- [--dir DIR] [--budget-mib 8] [--ratio 10]
//!     [--backend direct|std] [--seconds 3]
//! ```
//!
//! Promotion is off, so reads of leaf pages stay reads of the file (with `direct`, the
//! pool is the only cache and the numbers are the device's).

use std::time::{Duration, Instant};

use bfdb::{Backend, Config, Tree, TreeStats};

struct Args {
    dir: std::path::PathBuf,
    budget_mib: u64,
    ratio: u64,
    backend: String,
    seconds: f64,
}

fn args() -> Args {
    let mut a = Args {
        dir: std::env::temp_dir(),
        budget_mib: 8,
        ratio: 10,
        backend: "direct".into(),
        seconds: 3.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => a.dir = value.into(),
            "--budget-mib" => a.budget_mib = value.parse().expect("a number"),
            "--ratio" => a.ratio = value.parse().expect("a number"),
            "--backend" => a.backend = value,
            "--seconds" => a.seconds = value.parse().expect("a number"),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

fn backend(name: &str) -> Backend {
    match name {
        "std" => Backend::Std,
        "direct" => Backend::StdDirect,
        other => panic!("unknown backend {other} (std, direct)"),
    }
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

fn key(i: u64) -> Vec<u8> {
    format!("user{i:012}").into_bytes()
}

/// Runs `step` (which returns how many items it did) for about `seconds`; items per
/// second and the stats difference.
fn timed(tree: &Tree, seconds: f64, mut step: impl FnMut() -> u64) -> (f64, u64, TreeStats) {
    let before = tree.stats();
    let start = Instant::now();
    let mut items = 0;
    while start.elapsed() < Duration::from_secs_f64(seconds) {
        items += step();
    }
    let rate = items as f64 / start.elapsed().as_secs_f64();
    (rate, items, diff(&tree.stats(), &before))
}

fn diff(a: &TreeStats, b: &TreeStats) -> TreeStats {
    let mut d = a.clone();
    d.leaf_reads -= b.leaf_reads;
    d.leaf_writes -= b.leaf_writes;
    d.batched_leaf_reads -= b.batched_leaf_reads;
    d.batched_leaf_writes -= b.batched_leaf_writes;
    d.prefetched_leaf_pages -= b.prefetched_leaf_pages;
    d.stale_leaf_reads -= b.stale_leaf_reads;
    d.evictions -= b.evictions;
    d
}

fn main() -> bfdb::Result<()> {
    let a = args();
    let budget = a.budget_mib << 20;
    let path = a
        .dir
        .join(format!("bfdb-treeio-{}.bfdb", std::process::id()));
    let config = Config {
        memory_budget_bytes: budget,
        promotion_rate_percent: 0,
        scan_promotion_rate_percent: 0,
        backend: backend(&a.backend),
        ..Config::default()
    };
    let tree = Tree::open(&path, config)?;
    // About `ratio` times the budget in leaf pages (records cost ~130 bytes in a page).
    let n = a.ratio * budget / 100;
    let value = vec![b'v'; 100];
    let load = Instant::now();
    for i in 0..n {
        tree.insert(&key(i), &value)?;
    }
    tree.flush()?;
    let s = tree.stats();
    let file_mib = (s.leaf_pages * 4096) >> 20;
    println!(
        "backend {} (direct_io {}), budget {} MiB, {n} records, {} leaf pages = {file_mib} MiB \
         ({:.1}x the budget), loaded in {:.1} s",
        a.backend,
        s.direct_io,
        a.budget_mib,
        s.leaf_pages,
        file_mib as f64 / a.budget_mib as f64,
        load.elapsed().as_secs_f64()
    );
    let mut rng = Rng(42);

    println!("\npoint reads (uniform random keys)");
    let (rate, items, d) = timed(&tree, a.seconds, || {
        let _ = tree.get(&key(rng.below(n))).expect("get");
        1
    });
    println!(
        "  get loop          {rate:>10.0} keys/s  ({:.2} leaf reads/key)",
        d.leaf_reads as f64 / items as f64
    );
    for batch in [8, 32, 128] {
        let (rate, items, d) = timed(&tree, a.seconds, || {
            let keys: Vec<Vec<u8>> = (0..batch).map(|_| key(rng.below(n))).collect();
            let _ = tree.get_many(&keys).expect("get_many");
            batch
        });
        println!(
            "  get_many({batch:>3})     {rate:>10.0} keys/s  ({:.2} leaf reads/key, {} stale)",
            d.leaf_reads as f64 / items as f64,
            d.stale_leaf_reads
        );
    }

    println!("\nscans (2000 records from a random key)");
    for ahead in [0, 8, 32] {
        let (rate, _, d) = timed(&tree, a.seconds, || {
            let start = key(rng.below(n));
            let mut records = 0;
            for r in tree.range(start..).read_ahead(ahead).take(2000) {
                r.expect("scan");
                records += 1;
            }
            records
        });
        println!(
            "  read_ahead({ahead:>2})    {rate:>10.0} records/s  ({} leaf reads, {} read ahead)",
            d.leaf_reads, d.prefetched_leaf_pages
        );
    }

    println!("\nrandom upserts (evictions merge into leaf pages)");
    // Fill the pool with dirty mini-pages first, so every measured run evicts.
    timed(&tree, a.seconds, || {
        tree.insert(&key(rng.below(n)), &value).expect("insert");
        1
    });
    for batched in [false, true, false, true] {
        tree.set_batched_eviction(batched);
        let (rate, items, d) = timed(&tree, a.seconds, || {
            let i = rng.below(n);
            tree.insert(&key(i), &value).expect("insert");
            1
        });
        println!(
            "  batched eviction {:<5} {rate:>8.0} ops/s  ({:.2} leaf writes/op, {} of them \
             batched, {} evictions)",
            batched,
            d.leaf_writes as f64 / items as f64,
            d.batched_leaf_writes,
            d.evictions
        );
    }
    drop(tree);
    let _ = std::fs::remove_file(&path);
    Ok(())
}
