//! A microbenchmark of synced small writes (group commit): N threads each write
//! 16-byte keys with 16-byte values through a [`Db`] at [`Durability::Synced`], so
//! every call returns only after the `fdatasync` that covers its log record.
//!
//! Prints, per thread count: writes per second, the disk's cache flushes per write
//! (`/proc/diskstats`, the whole disk's, so other processes' flushes count too), and
//! the mean and 99th-percentile latency. `--through log` appends straight to a
//! [`wal::Log`] on a [`DirLog`] instead, which also reports the log's own count of
//! group writes (writes per sync, not disturbed by other processes).
//!
//! ```text
//! cargo run --release --example synced_writes -- [--threads 1,2,16] [--seconds 5]
//!     [--keys 100000] [--through db|log] [--dir <scratch directory>]
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bfdb::storage::DirLog;
use bfdb::wal::{self, LogOp, LogOptions};
use bfdb::{Config, Db, DbOptions, Durability};
use hdrhistogram::Histogram;

struct Args {
    threads: Vec<usize>,
    seconds: u64,
    keys: u64,
    through_log: bool,
    dir: Option<PathBuf>,
}

fn parse() -> Args {
    let mut a = Args {
        threads: vec![1, 2, 16],
        seconds: 5,
        keys: 100_000,
        through_log: false,
        dir: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--threads" => {
                a.threads = value()
                    .split(',')
                    .map(|t| t.parse().expect("--threads: numbers"))
                    .collect()
            }
            "--seconds" => a.seconds = value().parse().expect("--seconds: a number"),
            "--keys" => a.keys = value().parse().expect("--keys: a number"),
            "--through" => {
                a.through_log = match value().as_str() {
                    "db" => false,
                    "log" => true,
                    other => panic!("--through {other}: db or log"),
                }
            }
            "--dir" => a.dir = Some(PathBuf::from(value())),
            other => panic!("unknown option {other}; see the example's doc comment"),
        }
    }
    a
}

/// Cache flushes completed by the disk holding `dir` (statistic 16 of its
/// `/proc/diskstats` line as the kernel's `iostats.rst` numbers them after `major minor
/// name`, kernels from 5.5 on; statistic 15 is the milliseconds spent discarding), if it
/// can be read.
fn disk_flushes(dir: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let text = std::fs::read_to_string("/proc/diskstats").ok()?;
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let ours =
            f.first()?.parse::<u32>().ok()? == major && f.get(1)?.parse::<u32>().ok()? == minor;
        if ours {
            f.get(2 + 16)?.parse().ok()
        } else {
            None
        }
    })
}

/// A 16-byte key for `i`: a scrambled big-endian number, so neighbours spread.
fn key(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(b"user0000");
    k[8..].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
    k
}

/// What one measurement gives.
struct Run {
    writes: u64,
    elapsed: Duration,
    latency: Histogram<u64>,
}

/// Runs `threads` writers for `seconds`, each calling `write(thread, i)` in a loop.
fn measure(threads: usize, seconds: u64, write: impl Fn(usize, u64) + Sync) -> Run {
    let stop = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    let started = Instant::now();
    let latency = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, writes, write) = (&stop, &writes, &write);
                s.spawn(move || {
                    let mut h = Histogram::<u64>::new(3).unwrap();
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let at = Instant::now();
                        write(t, i);
                        h.record(at.elapsed().as_micros() as u64).unwrap();
                        i += 1;
                    }
                    writes.fetch_add(i, Ordering::Relaxed);
                    h
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(seconds));
        stop.store(true, Ordering::Relaxed);
        let mut all = Histogram::<u64>::new(3).unwrap();
        for h in handles {
            all.add(h.join().unwrap()).unwrap();
        }
        all
    });
    Run {
        writes: writes.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
        latency,
    }
}

fn main() {
    let args = parse();
    let scratch;
    let dir = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).unwrap();
            tempfile::tempdir_in(d).unwrap()
        }
        None => {
            scratch = tempfile::tempdir().unwrap();
            tempfile::tempdir_in(scratch.path()).unwrap()
        }
    };
    println!(
        "synced 16-byte writes through {}, {} s per run, in {}",
        if args.through_log { "the log" } else { "a Db" },
        args.seconds,
        dir.path().display()
    );
    println!(
        "{:>7} {:>12} {:>14} {:>13} {:>10} {:>10}",
        "threads", "writes/s", "flushes/write", "writes/group", "mean µs", "p99 µs"
    );
    let (db, log) = if args.through_log {
        let device = Arc::new(DirLog::open(dir.path()).unwrap());
        let (log, _) = wal::open(device, LogOptions::default()).unwrap();
        (None, Some(Arc::new(log)))
    } else {
        let options = DbOptions::default().config(Config {
            memory_budget_bytes: 64 << 20,
            ..Config::default()
        });
        let db = Db::open(dir.path(), options).unwrap();
        let tree = db.tree("t").unwrap();
        for i in 0..args.keys {
            tree.insert_with(&key(i), &[0u8; 16], Durability::Unlogged)
                .unwrap();
        }
        db.checkpoint().unwrap();
        (Some((db, tree)), None)
    };
    for &threads in &args.threads {
        let flushes = disk_flushes(dir.path());
        let groups = log.as_ref().map(|l| l.groups_written());
        let run = measure(threads, args.seconds, |t, i| {
            let k = key((i * threads as u64 + t as u64) % args.keys);
            let v = i.to_le_bytes().repeat(2);
            if let Some((_, tree)) = &db {
                tree.insert_with(&k, &v, Durability::Synced).unwrap();
            } else if let Some(log) = &log {
                let seq = log
                    .append(&[LogOp::Put {
                        keyspace: 1,
                        key: k.to_vec(),
                        value: v,
                    }])
                    .unwrap();
                log.wait_durable(seq).unwrap();
            }
        });
        let per_write = |n: Option<u64>| match n {
            Some(n) if run.writes > 0 => format!("{:.3}", n as f64 / run.writes as f64),
            _ => "-".into(),
        };
        let flushed = flushes
            .zip(disk_flushes(dir.path()))
            .map(|(a, b)| b.saturating_sub(a));
        let grouped = groups
            .zip(log.as_ref().map(|l| l.groups_written()))
            .map(|(a, b)| b - a)
            .filter(|&g| g > 0)
            .map_or("-".into(), |g| {
                format!("{:.2}", run.writes as f64 / g as f64)
            });
        println!(
            "{:>7} {:>12.0} {:>14} {:>13} {:>10.0} {:>10}",
            threads,
            run.writes as f64 / run.elapsed.as_secs_f64(),
            per_write(flushed),
            grouped,
            run.latency.mean(),
            run.latency.value_at_quantile(0.99),
        );
    }
}
