//! The child process: opens one engine, loads it, runs every workload at every thread
//! count, and prints one machine-readable line per result on stdout.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::Options;
use crate::engines::{self, Engine, EngineSpec, OpenOptions};
use crate::keygen::{Chooser, Hotspot, Op, Rng, Workload, Zipf, key_into, value_into};
use crate::report::{LoadRow, RecoveryRow, RunRow};

/// Bytes this process has read from and written to the block layer (`/proc/self/io`),
/// including exited threads; zeros where the file is unavailable.
pub fn proc_io() -> (u64, u64) {
    let Ok(text) = std::fs::read_to_string("/proc/self/io") else {
        return (0, 0);
    };
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("read_bytes:"), field("write_bytes:"))
}

/// CPU time this process has used so far, user plus system, in seconds (every thread,
/// exited ones included; io_uring's kernel workers are threads of the process too).
fn process_cpu_secs() -> f64 {
    // SAFETY: `getrusage` only writes the struct it is given, which is plain data.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return 0.0;
        }
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// What the block device under a directory has done since boot (`/proc/diskstats`): the
/// whole device's counts, every process's IO included, not only the child's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskCounters {
    /// Reads the device completed (after the block layer merged adjacent requests): what
    /// is held against the disk's limit for small random reads.
    pub reads: u64,
    /// Bytes read from the device (sectors read × 512).
    pub read_bytes: u64,
    /// Bytes written to the device (sectors written × 512): what reached the disk, whether
    /// the engine wrote it with O_DIRECT, through the page cache, or as the filesystem's
    /// journal and metadata on its behalf.
    pub write_bytes: u64,
    /// Cache flushes completed (kernels from 5.5 on; 0 before): what fsync and fdatasync
    /// cost on a disk with a write cache.
    pub flushes: u64,
}

impl DiskCounters {
    /// The counts between `self` (earlier) and `later`.
    pub fn until(self, later: DiskCounters) -> DiskCounters {
        DiskCounters {
            reads: later.reads.saturating_sub(self.reads),
            read_bytes: later.read_bytes.saturating_sub(self.read_bytes),
            write_bytes: later.write_bytes.saturating_sub(self.write_bytes),
            flushes: later.flushes.saturating_sub(self.flushes),
        }
    }
}

/// The counters of the device `major:minor` in the text of `/proc/diskstats`.
///
/// Each line is `major minor name` and then the statistics (the kernel's
/// `Documentation/admin-guide/iostats.rst` numbers them from 1): 1 reads completed, 3
/// sectors read, 7 sectors
/// written, 16 flush requests completed. Sectors are 512 bytes whatever the device's.
pub fn parse_diskstats(text: &str, major: u32, minor: u32) -> Option<DiskCounters> {
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let ours = fields.first()?.parse::<u32>().ok()? == major
            && fields.get(1)?.parse::<u32>().ok()? == minor;
        if !ours {
            return None;
        }
        // Statistic n (from 1) is field 2 + n (from 0).
        let stat = |n: usize| fields.get(2 + n).and_then(|v| v.parse::<u64>().ok());
        Some(DiskCounters {
            reads: stat(1)?,
            read_bytes: stat(3)? * 512,
            write_bytes: stat(7)? * 512,
            flushes: stat(16).unwrap_or(0),
        })
    })
}

/// The counters of the device that holds `dir`; `None` where they cannot be read (a
/// filesystem with no block device of its own, no `/proc/diskstats`).
pub fn disk_counters(dir: &std::path::Path) -> Option<DiskCounters> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    let text = std::fs::read_to_string("/proc/diskstats").ok()?;
    parse_diskstats(&text, libc::major(dev), libc::minor(dev))
}

/// Writes what the filesystem holding `dir` has buffered to its device (`syncfs`), so
/// that writes an engine left in the page cache count in the phase that made them, not
/// in a later one (or in none). Untimed. Best effort: it also writes back other
/// processes' dirty pages on that filesystem.
pub fn sync_filesystem(dir: &std::path::Path) {
    let Ok(file) = std::fs::File::open(dir) else {
        return;
    };
    use std::os::fd::AsRawFd;
    // SAFETY: `syncfs` only reads the descriptor, which `file` keeps open for the call.
    unsafe { libc::syncfs(file.as_raw_fd()) };
}

/// Peak resident set size (`VmHWM`) in bytes.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib << 10)
}

/// Resets the peak RSS to the current RSS (Linux: writing 5 to `clear_refs`), so each run
/// reports its own peak; best effort.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Records that go to the engine in one `load_batch` call, at most.
const LOAD_BATCH: u64 = 1000;

/// Bytes of keys and values in one `load_batch` call, at most (but one record at least):
/// each load thread holds its batch, and an engine may copy it whole (RocksDB's
/// `WriteBatch`), outside the budget; a thousand 1 MiB values would be 1 GiB.
const LOAD_BATCH_BYTES: u64 = 4 << 20;

/// Records per `load_batch` call for records of `record_bytes`.
fn load_batch_records(record_bytes: usize) -> u64 {
    (LOAD_BATCH_BYTES / record_bytes.max(1) as u64).clamp(1, LOAD_BATCH)
}

/// Runs the child: waits for the parent's go-ahead on stdin (the parent moves it into a
/// cgroup first), then loads and runs.
pub fn main(options: &Options, spec: &EngineSpec) -> Result<(), String> {
    wait_for_go_ahead()?;
    let engine_name = spec.label.as_str();
    let open = open_options(options, spec)?;
    let engine = engines::open(&spec.name, &open)?;
    let load = load(&*engine, spec, options, &open)?;
    emit(&load.to_line());
    let print_stats = |when: &str| {
        if let Some(stats) = engine.stats().filter(|_| options.stats) {
            eprintln!("{engine_name} after {when}: {stats}");
        }
    };
    print_stats("the load");

    let existing = AtomicU64::new(options.records);
    let zipf = Zipf::new(options.records, options.theta)?;
    for (wi, &workload) in options.workloads.iter().enumerate() {
        if !engines::runs_workload(&spec.name, workload) {
            // The parent notes the skip.
            continue;
        }
        for &threads in &options.threads {
            let seed = options.seed ^ ((wi as u64) << 32) ^ threads as u64;
            let ctx = RunContext {
                engine: &*engine,
                options,
                workload,
                threads,
                existing: &existing,
                zipf: &zipf,
            };
            if options.warmup_secs > 0.0 {
                // Unmeasured, and on other keys than the row's own draw.
                run(&ctx, Span::Secs(options.warmup_secs), !seed);
            }
            let span = options
                .ops
                .map_or(Span::Secs(options.duration_secs), Span::Ops);
            let mut row = run(&ctx, span, seed);
            row.engine = engine_name.to_string();
            row.mode = engine.mode();
            row.durability = spec.durability.name().to_string();
            row.budget_bytes = engine.budget_bytes();
            row.data_bytes_after_load = load.data_bytes;
            let size = engines::dir_size(&open.dir);
            row.data_bytes_after_run = size.apparent_bytes;
            row.data_allocated_bytes_after_run = size.allocated_bytes;
            row.records_after_run = existing.load(Ordering::Relaxed);
            row.key_bytes = options.key_bytes as u64;
            row.value_bytes = options.value_bytes as u64;
            row.load_ops_per_sec = load.ops_per_sec;
            emit(&row.to_line());
            print_stats(&format!("{} at {threads} threads", workload.name()));
        }
    }
    if options.recovery {
        // End as a crash would: no clean close, no checkpoint, no final sync. Every
        // result line is already flushed (`emit`), and `_exit` skips the destructors.
        // SAFETY: `_exit` ends the process; nothing runs after it.
        unsafe { libc::_exit(0) };
    }
    drop(engine);
    Ok(())
}

/// Opens the engine on the files a run left (`--recovery`), timed, checks a sample of the
/// loaded records, reports one line and ends without a clean close.
pub fn recover(options: &Options, spec: &EngineSpec) -> Result<(), String> {
    wait_for_go_ahead()?;
    let open = open_options(options, spec)?;
    let data_bytes = engines::dir_size_bytes(&open.dir);
    let (read0, write0) = proc_io();
    let start = Instant::now();
    let engine = engines::open(&spec.name, &open)?;
    let open_secs = start.elapsed().as_secs_f64();
    let (read1, write1) = proc_io();
    let info = engine.recovery();
    // Loaded records, spread over the load order: the load was made durable by the
    // engine's flush, so each should be there whatever the durability level.
    let sampled = options.records.min(1000);
    let mut key = vec![0u8; options.key_bytes];
    let mut out = Vec::new();
    let mut found = 0;
    for s in 0..sampled {
        key_into(
            options.insert_order,
            s * options.records / sampled,
            &mut key,
        );
        found += engine.get(&key, &mut out)? as u64;
    }
    let row = RecoveryRow {
        engine: spec.label.clone(),
        mode: engine.mode(),
        durability: spec.durability.name().to_string(),
        open_secs,
        engine_secs: info.as_ref().map_or(-1.0, |i| i.secs),
        log_bytes: info.as_ref().map_or(-1, |i| i.log_bytes as i64),
        records_replayed: info.as_ref().map_or(-1, |i| i.records_replayed as i64),
        sampled,
        found,
        read_bytes: read1 - read0,
        write_bytes: write1 - write0,
        data_bytes,
    };
    emit(&row.to_line());
    // SAFETY: `_exit` ends the process; nothing runs after it (no close: the parent
    // removes the files).
    unsafe { libc::_exit(0) };
}

/// Waits for the parent's line on stdin: it has moved this process into its cgroup.
fn wait_for_go_ahead() -> Result<(), String> {
    let mut go = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut go)
        .map_err(|e| format!("waiting for the go-ahead: {e}"))?;
    Ok(())
}

fn open_options(options: &Options, spec: &EngineSpec) -> Result<OpenOptions, String> {
    Ok(OpenOptions {
        budget_bytes: options.memory_mib_of(&spec.name) << 20,
        dir: options.dir.clone().ok_or("the child needs --dir")?,
        direct_io: options.direct_io,
        in_memory: options.in_memory,
        bftree_io_uring: options.bftree_io_uring,
        bfdb_backend: options.bfdb_backend.clone(),
        bfdb_value_cache_percent: options.bfdb_value_cache_percent,
        key_bytes: options.key_bytes,
        value_bytes: options.value_bytes,
        records: options.records,
        hash_hot_log_bytes: options.hash_hot_log_mib.map(|m| m << 20),
        hash_read_cache_bytes: options.hash_read_cache_mib.map(|m| m << 20),
        hash_compaction_threads: options.hash_compaction_threads,
        checkpoint_log_bytes: options.checkpoint_log_mib.map(|m| m << 20),
        durability: spec.durability,
    })
}

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn load(
    engine: &dyn Engine,
    spec: &EngineSpec,
    options: &Options,
    open: &OpenOptions,
) -> Result<LoadRow, String> {
    let name = spec.label.as_str();
    let bar = indicatif::ProgressBar::new(options.records);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix:>9} loading [{bar:40}] {pos}/{len} records, {per_sec}, eta {eta}",
        )
        .map_err(|e| e.to_string())?
        .progress_chars("=> "),
    );
    bar.set_prefix(name.to_string());
    let next = AtomicU64::new(0);
    let batch_records = load_batch_records(options.key_bytes + options.value_bytes);
    let failed: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    let (read0, write0) = proc_io();
    let disk0 = disk_counters(&open.dir);
    let cpu0 = process_cpu_secs();
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..options.load_threads.max(1) {
            s.spawn(|| {
                let mut batch: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
                loop {
                    let first = next.fetch_add(batch_records, Ordering::Relaxed);
                    if first >= options.records {
                        return;
                    }
                    let end = (first + batch_records).min(options.records);
                    batch.resize_with((end - first) as usize, || {
                        (vec![0; options.key_bytes], vec![0; options.value_bytes])
                    });
                    for (i, (k, v)) in (first..end).zip(batch.iter_mut()) {
                        key_into(options.insert_order, i, k);
                        value_into(i, 0, v);
                    }
                    if let Err(e) = engine.load_batch(&batch) {
                        *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        next.store(u64::MAX / 2, Ordering::Relaxed);
                        return;
                    }
                    bar.inc(end - first);
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(format!("{name}: loading failed: {e}"));
    }
    // Loading includes making the loaded data reach the files.
    engine.flush().map_err(|e| format!("{name}: flush: {e}"))?;
    let secs = start.elapsed().as_secs_f64();
    let cpu_secs = process_cpu_secs() - cpu0;
    bar.finish_and_clear();
    let (read1, write1) = proc_io();
    sync_filesystem(&open.dir);
    let disk = disk0.zip(disk_counters(&open.dir)).map(|(a, b)| a.until(b));
    let size = engines::dir_size(&open.dir);
    Ok(LoadRow {
        engine: name.to_string(),
        mode: engine.mode(),
        durability: spec.durability.name().to_string(),
        records: options.records,
        secs,
        ops_per_sec: options.records as f64 / secs,
        data_bytes: size.apparent_bytes,
        data_allocated_bytes: size.allocated_bytes,
        key_bytes: options.key_bytes as u64,
        value_bytes: options.value_bytes as u64,
        read_bytes: read1 - read0,
        write_bytes: write1 - write0,
        device_reads: disk.map(|d| d.reads),
        device_read_bytes: disk.map(|d| d.read_bytes),
        device_write_bytes: disk.map(|d| d.write_bytes),
        cpu_us_per_record: cpu_secs * 1e6 / options.records.max(1) as f64,
        peak_rss_bytes: peak_rss_bytes(),
        budget_bytes: engine.budget_bytes(),
    })
}

/// What one worker thread measured.
struct ThreadResult {
    ops: u64,
    /// Operations that wrote a record (updates, inserts, read-modify-writes).
    writes: u64,
    histogram: Histogram<u64>,
    not_found: u64,
    errors: u64,
    first_error: Option<String>,
}

/// Operations a thread claims at a time from the shared budget in `--ops` mode.
const OPS_CLAIM: u64 = 64;

/// How long a run lasts.
#[derive(Clone, Copy, Debug)]
enum Span {
    /// A time, in seconds.
    Secs(f64),
    /// A number of operations, shared by the threads.
    Ops(u64),
}

/// What a run works on: the engine, the workload and its thread count, and the key
/// choice's shared state.
struct RunContext<'a> {
    engine: &'a dyn Engine,
    options: &'a Options,
    workload: Workload,
    threads: usize,
    existing: &'a AtomicU64,
    zipf: &'a Zipf,
}

#[allow(clippy::too_many_arguments)]
fn worker(
    engine: &dyn Engine,
    options: &Options,
    workload: Workload,
    chooser: &Chooser<'_>,
    seed: u64,
    stop: &AtomicBool,
    ops_left: Option<&AtomicU64>,
) -> ThreadResult {
    let mut rng = Rng::new(seed);
    let mix = workload.mix();
    // 1 ns to 100 s at three significant digits.
    let histogram = Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid bounds");
    let mut key = vec![0u8; options.key_bytes];
    let mut value = vec![0u8; options.value_bytes];
    let mut out = Vec::with_capacity(4096);
    let mut not_found = 0u64;
    let mut tally = Tally {
        result: ThreadResult {
            ops: 0,
            writes: 0,
            histogram,
            not_found: 0,
            errors: 0,
            first_error: None,
        },
        not_found: 0,
    };
    let batch = options.batch.max(1);
    let mut reads: Vec<Vec<u8>> = Vec::with_capacity(batch);
    let mut claimed = 0u64;
    loop {
        if let Some(ops_left) = ops_left {
            if claimed == 0 {
                let left = ops_left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
                        (l > 0).then(|| l.saturating_sub(OPS_CLAIM))
                    })
                    .unwrap_or(0);
                claimed = left.min(OPS_CLAIM);
                if claimed == 0 {
                    break;
                }
            }
            claimed -= 1;
        } else if stop.load(Ordering::Relaxed) {
            break;
        }
        let op = mix.pick(&mut rng);
        if batch > 1 && op == Op::Read {
            let mut key = vec![0u8; options.key_bytes];
            key_into(
                options.insert_order,
                chooser.existing_index(&mut rng),
                &mut key,
            );
            reads.push(key);
            if reads.len() == batch {
                read_batch(engine, &mut reads, &mut tally);
            }
            continue;
        }
        tally.result.writes +=
            u64::from(matches!(op, Op::Update | Op::Insert | Op::ReadModifyWrite));
        let t0 = Instant::now();
        let result = match op {
            Op::Read => {
                key_into(
                    options.insert_order,
                    chooser.existing_index(&mut rng),
                    &mut key,
                );
                engine.get(&key, &mut out).map(|found| {
                    not_found += !found as u64;
                })
            }
            Op::Update => {
                let i = chooser.existing_index(&mut rng);
                key_into(options.insert_order, i, &mut key);
                value_into(i, rng.next_u64(), &mut value);
                engine.update(&key, &value)
            }
            Op::Insert => {
                let i = chooser.new_index();
                key_into(options.insert_order, i, &mut key);
                value_into(i, 0, &mut value);
                engine.insert(&key, &value)
            }
            Op::Scan => {
                key_into(
                    options.insert_order,
                    chooser.existing_index(&mut rng),
                    &mut key,
                );
                engine.scan(&key, options.scan_length).map(drop)
            }
            Op::ReadModifyWrite => {
                let i = chooser.existing_index(&mut rng);
                key_into(options.insert_order, i, &mut key);
                engine.get(&key, &mut out).and_then(|found| {
                    not_found += !found as u64;
                    value_into(i, rng.next_u64(), &mut value);
                    engine.update(&key, &value)
                })
            }
        };
        tally.done(1, t0.elapsed(), result);
    }
    read_batch(engine, &mut reads, &mut tally);
    tally.not_found += not_found;
    tally.result
}

/// Reads `reads` (if any) with one multi-key read, and empties it.
fn read_batch(engine: &dyn Engine, reads: &mut Vec<Vec<u8>>, tally: &mut Tally) {
    if reads.is_empty() {
        return;
    }
    let t0 = Instant::now();
    let result = engine.get_many(reads).map(|found| {
        tally.not_found += (reads.len() - found) as u64;
    });
    tally.done(reads.len() as u64, t0.elapsed(), result);
    reads.clear();
}

/// A worker's counts as it goes.
struct Tally {
    result: ThreadResult,
    not_found: u64,
}

impl Tally {
    /// Counts `ops` operations that took `elapsed` together (each is given that
    /// latency) and ended in `result`.
    fn done(&mut self, ops: u64, elapsed: Duration, result: Result<(), String>) {
        let r = &mut self.result;
        for _ in 0..ops {
            r.histogram.saturating_record(elapsed.as_nanos() as u64);
        }
        r.ops += ops;
        if let Err(e) = result {
            r.errors += 1;
            r.first_error.get_or_insert(e);
        }
    }
}

/// Runs `ctx`'s workload for `span` and measures it.
fn run(ctx: &RunContext<'_>, span: Span, seed: u64) -> RunRow {
    let &RunContext {
        engine,
        options,
        workload,
        threads,
        existing,
        zipf,
    } = ctx;
    let distribution = workload.distribution(options.distribution);
    let hotspot = Hotspot {
        hot_set_fraction: options.hot_set_fraction,
        hot_op_fraction: options.hot_op_fraction,
    };
    let chooser = Chooser::new(distribution, zipf, hotspot, existing);
    let stop = AtomicBool::new(false);
    let ops_left = match span {
        Span::Ops(n) => Some(AtomicU64::new(n)),
        Span::Secs(_) => None,
    };
    reset_peak_rss();
    // The child's --dir is the engine's directory.
    let dir = options.dir.as_deref().unwrap_or(std::path::Path::new("."));
    let disk0 = disk_counters(dir);
    let (read0, write0) = proc_io();
    let cpu0 = process_cpu_secs();
    let start = Instant::now();
    let results: Vec<ThreadResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|t| {
                let (chooser, stop, ops_left) = (&chooser, &stop, ops_left.as_ref());
                let seed = seed.wrapping_add((t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                s.spawn(move || worker(engine, options, workload, chooser, seed, stop, ops_left))
            })
            .collect();
        if let Span::Secs(secs) = span {
            std::thread::sleep(Duration::from_secs_f64(secs));
            stop.store(true, Ordering::Relaxed);
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("a worker thread panicked"))
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let (read1, write1) = proc_io();
    let cpu_secs = process_cpu_secs() - cpu0;
    sync_filesystem(dir);
    let disk = disk0.zip(disk_counters(dir)).map(|(a, b)| a.until(b));
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 100_000_000_000, 3).expect("bounds");
    let (mut ops, mut writes, mut not_found, mut errors) = (0, 0, 0, 0);
    for r in &results {
        histogram.add(&r.histogram).expect("same bounds");
        ops += r.ops;
        writes += r.writes;
        not_found += r.not_found;
        errors += r.errors;
        if let Some(e) = &r.first_error {
            eprintln!("ycsb: {} at {threads} threads: {e}", workload.name());
        }
    }
    let per_op = |b: u64| b as f64 / ops.max(1) as f64;
    let us = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    RunRow {
        workload: workload.name().to_string(),
        distribution: format!("{distribution:?}").to_lowercase(),
        threads,
        ops,
        secs,
        ops_per_sec: ops as f64 / secs,
        p50_us: us(0.5),
        p99_us: us(0.99),
        p999_us: us(0.999),
        read_bytes_per_op: per_op(read1 - read0),
        write_bytes_per_op: per_op(write1 - write0),
        disk_flushes_per_op: per_op(disk.map_or(0, |d| d.flushes)),
        writes,
        device_reads: disk.map(|d| d.reads),
        device_read_bytes: disk.map(|d| d.read_bytes),
        device_write_bytes: disk.map(|d| d.write_bytes),
        cpu_us_per_op: cpu_secs * 1e6 / ops.max(1) as f64,
        peak_rss_bytes: peak_rss_bytes(),
        not_found,
        errors,
        ..RunRow::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_batches_hold_a_thousand_records_or_four_mebibytes() {
        assert_eq!(load_batch_records(32), 1000);
        assert_eq!(load_batch_records(16 + 1024), 1000);
        assert_eq!(load_batch_records(16 + 8192), 511);
        assert_eq!(load_batch_records(16 + 65536), 63);
        assert_eq!(load_batch_records(16 + (1 << 20)), 3);
        assert_eq!(load_batch_records(64 << 20), 1);
    }

    #[test]
    fn diskstats_fields_are_read_by_their_kernel_numbers() {
        // A line of this machine's /proc/diskstats (kernel 5.5+: 17 statistics), and a
        // line of an older kernel without the flush statistics.
        let text = "   7       0 loop0 5 0 10 0 0 0 0 0 0 4 0 0 0 0 0 0 0\n \
                    254       0 vda 29268035 1582492 331871532 8691876 17667871 3034330 \
                    491223232 4419510 0 1242900 13344365 1352746 207 315112400 135156 \
                    1983913 97820\n 8 16 sdb 1 2 3 4 5 6 7 8 9 10 11\n";
        let vda = parse_diskstats(text, 254, 0).unwrap();
        assert_eq!(vda.reads, 29_268_035);
        assert_eq!(vda.read_bytes, 331_871_532 * 512);
        assert_eq!(vda.write_bytes, 491_223_232 * 512);
        // Statistic 16, not 15 (the milliseconds spent discarding: 135156).
        assert_eq!(vda.flushes, 1_983_913);
        let sdb = parse_diskstats(text, 8, 16).unwrap();
        assert_eq!(
            (sdb.reads, sdb.read_bytes, sdb.write_bytes, sdb.flushes),
            (1, 3 * 512, 7 * 512, 0)
        );
        assert!(parse_diskstats(text, 254, 1).is_none());
        let later = DiskCounters {
            reads: 3,
            read_bytes: 10,
            write_bytes: 5,
            flushes: 2,
        };
        let earlier = DiskCounters {
            reads: 1,
            read_bytes: 4,
            write_bytes: 5,
            flushes: 3,
        };
        assert_eq!(
            earlier.until(later),
            DiskCounters {
                reads: 2,
                read_bytes: 6,
                write_bytes: 0,
                flushes: 0
            }
        );
    }
}
