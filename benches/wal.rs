//! Criterion benchmarks for the write-ahead log's append path: what a logged write pays
//! to put its record in the log's buffer, from one thread and from many at once (the
//! log's lock is shared by every writer of a `Db`).
//!
//! Run with `cargo bench --bench wal`. These measure; no test asserts a timing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bfdb::storage::LogDevice;
use bfdb::wal::{self, LogOpRef, LogOptions};
use criterion::{Criterion, criterion_group, criterion_main};
use parking_lot::Mutex;

/// A device that keeps no bytes: the benchmark measures appending, not the disk, and
/// a flush costs it only the log's own packing of blocks.
#[derive(Default)]
struct NullLog {
    segments: Mutex<Vec<u64>>,
}

impl LogDevice for NullLog {
    fn create(&self, id: u64, _len_bytes: u64) -> std::io::Result<()> {
        self.segments.lock().push(id);
        Ok(())
    }
    fn write_at(&self, _id: u64, _offset: u64, _buf: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
    fn read_at(&self, _id: u64, _offset: u64, _buf: &mut [u8]) -> std::io::Result<usize> {
        Ok(0)
    }
    fn sync(&self, _id: u64) -> std::io::Result<()> {
        Ok(())
    }
    fn remove(&self, id: u64) -> std::io::Result<()> {
        self.segments.lock().retain(|&s| s != id);
        Ok(())
    }
    fn list(&self) -> std::io::Result<Vec<u64>> {
        Ok(self.segments.lock().clone())
    }
}

/// Records appended between two flushes (which keep the log's buffer bounded).
const FLUSH_EVERY: u64 = 4096;

/// Appends `n` puts of 16-byte keys and 16-byte values (the driver's default record),
/// flushing every [`FLUSH_EVERY`], and returns the time spent appending.
fn append_puts(log: &wal::Log, first: u64, n: u64) -> Duration {
    let mut spent = Duration::ZERO;
    let value = [7u8; 16];
    let mut i = 0;
    while i < n {
        let run = FLUSH_EVERY.min(n - i);
        let started = Instant::now();
        for j in i..i + run {
            let mut key = [0u8; 16];
            key[8..].copy_from_slice(&(first + j).to_be_bytes());
            let op = LogOpRef::Put {
                keyspace: 1,
                key: &key,
                value: &value,
            };
            log.append_refs(std::iter::once(op)).expect("append");
        }
        spent += started.elapsed();
        log.flush().expect("flush");
        i += run;
    }
    spent
}

fn append(c: &mut Criterion) {
    let mut group = c.benchmark_group("wal/append 16+16 B put");
    for threads in [1u64, 2, 16] {
        group.bench_function(format!("{threads} threads"), |b| {
            let (log, _) =
                wal::open(Arc::new(NullLog::default()), LogOptions::default()).expect("open");
            let log = Arc::new(log);
            b.iter_custom(|iters| {
                // Each thread appends its share; the time is the slowest thread's time
                // spent appending (flushes excluded), so lock waits count.
                let share = iters.div_ceil(threads);
                std::thread::scope(|s| {
                    let handles: Vec<_> = (0..threads)
                        .map(|t| {
                            let log = Arc::clone(&log);
                            s.spawn(move || append_puts(&log, t << 40, share))
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("appender"))
                        .max()
                        .unwrap_or_default()
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, append);
criterion_main!(benches);
