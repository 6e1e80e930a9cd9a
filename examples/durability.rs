//! Two measurements of the database directory that the YCSB-like driver does not make:
//!
//! 1. **Recovery time per GiB of log.** A child process writes logged records with
//!    checkpoints off until the log holds `--log-mib` MiB, makes them durable, and
//!    exits without closing the database (as a crash would leave it). The parent then
//!    opens the directory and reports the time recovery took, the log bytes it replayed,
//!    and the rate.
//! 2. **Read latency while a checkpoint runs.** Reader threads do random point reads
//!    while a writer updates records, first with no checkpoint running, then with
//!    checkpoints back to back; the latency percentiles of both phases are printed side
//!    by side.
//!
//! ```text
//! cargo run --release --example durability -- [--log-mib 1024] [--records 2000000]
//!     [--memory-mib 64] [--readers 2] [--seconds 10] [--dir <scratch directory>]
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bfdb::{Config, Db, DbOptions, Durability};
use hdrhistogram::Histogram;

struct Args {
    log_mib: u64,
    records: u64,
    memory_mib: u64,
    readers: usize,
    seconds: u64,
    dir: Option<PathBuf>,
    child: Option<PathBuf>,
}

fn parse() -> Args {
    let mut a = Args {
        log_mib: 1024,
        records: 2_000_000,
        memory_mib: 64,
        readers: 2,
        seconds: 10,
        dir: None,
        child: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--log-mib" => a.log_mib = value().parse().expect("--log-mib: a number"),
            "--records" => a.records = value().parse().expect("--records: a number"),
            "--memory-mib" => a.memory_mib = value().parse().expect("--memory-mib: a number"),
            "--readers" => a.readers = value().parse().expect("--readers: a number"),
            "--seconds" => a.seconds = value().parse().expect("--seconds: a number"),
            "--dir" => a.dir = Some(PathBuf::from(value())),
            "--child-write" => a.child = Some(PathBuf::from(value())),
            other => panic!("unknown option {other}; see the example's doc comment"),
        }
    }
    a
}

fn options(memory_mib: u64) -> DbOptions {
    DbOptions::default().config(Config {
        memory_budget_bytes: memory_mib << 20,
        ..Config::default()
    })
}

fn key(i: u64) -> [u8; 16] {
    // Scattered over the key space, so that updates touch pages all over the tree.
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

/// The child: writes until the log holds `log_mib`, persists, and exits without closing.
fn child_write(dir: &Path, args: &Args) {
    let db = Db::open(
        dir,
        options(args.memory_mib)
            .checkpoint_log_bytes(0)
            .checkpoint_interval(None)
            .checkpoint_on_close(false),
    )
    .expect("opening the database");
    let tree = db.tree("t").expect("the keyspace");
    let value = [0x5au8; 100];
    let mut i = 0u64;
    while db.stats().log_bytes_since_checkpoint < args.log_mib << 20 {
        for _ in 0..10_000 {
            tree.insert_with(&key(i % args.records), &value, Durability::Logged)
                .expect("a write");
            i += 1;
        }
    }
    db.persist().expect("persist");
    println!(
        "wrote {i} records, {} log bytes",
        db.stats().log_bytes_since_checkpoint
    );
    // A crash: no checkpoint, no close.
    std::process::exit(0);
}

fn percentiles(h: &Histogram<u64>) -> String {
    format!(
        "p50 {:>6.1} µs  p99 {:>7.1} µs  p99.9 {:>8.1} µs  max {:>8.1} µs  ({} reads)",
        h.value_at_quantile(0.5) as f64 / 1e3,
        h.value_at_quantile(0.99) as f64 / 1e3,
        h.value_at_quantile(0.999) as f64 / 1e3,
        h.max() as f64 / 1e3,
        h.len()
    )
}

/// Reads for `seconds` on `readers` threads while one thread updates, with or without
/// checkpoints back to back; returns the merged read latencies and the checkpoints run.
fn read_phase(db: &Arc<Db>, args: &Args, checkpoints: bool) -> (Histogram<u64>, u64) {
    let tree = db.tree("t").expect("the keyspace");
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..args.readers)
        .map(|r| {
            let (tree, stop, records) = (tree.clone(), stop.clone(), args.records);
            std::thread::spawn(move || {
                let mut h = Histogram::<u64>::new(3).expect("a histogram");
                let mut x = 0x1234_5678_9abc_def0u64 ^ r as u64;
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let started = Instant::now();
                    tree.get_into(&key(x % records), &mut out).expect("a read");
                    h.record(started.elapsed().as_nanos() as u64)
                        .expect("in range");
                }
                h
            })
        })
        .collect();
    let writer = {
        let (tree, stop, records) = (tree.clone(), stop.clone(), args.records);
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                tree.insert(&key((i * 7919) % records), &[0xa5; 100])
                    .expect("a write");
                i += 1;
            }
        })
    };
    let mut runs = 0;
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    while Instant::now() < deadline {
        if checkpoints {
            db.checkpoint().expect("a checkpoint");
            runs += 1;
        } else {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("the writer");
    let mut all = Histogram::<u64>::new(3).expect("a histogram");
    for r in readers {
        all.add(r.join().expect("a reader")).expect("same bounds");
    }
    (all, runs)
}

fn main() {
    let args = parse();
    if let Some(dir) = &args.child {
        child_write(dir, &args);
        return;
    }
    let scratch = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("bfdb-durability-{}", std::process::id()))
    });
    let dir = scratch.join("db");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the scratch directory");

    println!(
        "1. recovery: a child writes {} MiB of log and exits without closing",
        args.log_mib
    );
    let status = Command::new(std::env::current_exe().expect("this program"))
        .args(["--child-write", &dir.display().to_string()])
        .args(["--log-mib", &args.log_mib.to_string()])
        .args(["--records", &args.records.to_string()])
        .args(["--memory-mib", &args.memory_mib.to_string()])
        .status()
        .expect("running the child");
    assert!(status.success(), "the child failed: {status}");
    let db = Db::open(&dir, options(args.memory_mib).checkpoint_interval(None))
        .expect("recovering the database");
    let r = db.recovery().clone();
    let gib = r.log_bytes as f64 / (1u64 << 30) as f64;
    println!(
        "   recovery: {:.2} s for {:.0} MiB of log ({} records replayed, {} writes superseded \
         by a later write of their key): {:.1} s per GiB, {:.0} records/s",
        r.duration.as_secs_f64(),
        r.log_bytes as f64 / (1u64 << 20) as f64,
        r.records_replayed,
        r.writes_superseded,
        r.duration.as_secs_f64() / gib.max(1e-9),
        r.records_replayed as f64 / r.duration.as_secs_f64()
    );

    println!(
        "2. read latency, {} readers and one writer, {} s per phase, {} MiB budget",
        args.readers, args.seconds, args.memory_mib
    );
    let db = Arc::new(db);
    let (quiet, _) = read_phase(&db, &args, false);
    let (busy, runs) = read_phase(&db, &args, true);
    let stats = db.stats();
    println!("   no checkpoint:          {}", percentiles(&quiet));
    println!("   checkpoints ({runs:>3} run): {}", percentiles(&busy));
    println!(
        "   the last checkpoint took {:.2} s and recorded {} leaf pages",
        stats.last_checkpoint_duration.as_secs_f64(),
        stats.last_checkpoint_leaf_pages
    );
    drop(db);
    let _ = std::fs::remove_dir_all(&scratch);
}
