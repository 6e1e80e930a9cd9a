//! A YCSB-like driver that runs bfdb's `Tree` and `HashStore` side by side with the engines
//! users would pick instead: the Bf-Tree reference crate (`bf-tree`), `RwLock<BTreeMap>`, and
//! behind cargo features of the same names RocksDB, sled, fjall, redb and oxifaster.
//!
//! ```sh
//! cargo run --release --example ycsb                  # ~2 minutes: bfdb vs bftree vs btreemap
//! cargo run --release --example ycsb -- --small       # a few thousand operations per engine (CI)
//! cargo run --release --example ycsb -- --help        # every option
//! cargo run --release --example ycsb -- --records 10000000 --memory-mib 32 \
//!     --workloads read,mix,update,scan --threads 2,16 --distribution zipf --cgroup
//! cargo run --release --example ycsb --features rocksdb,fjall,redb -- \
//!     --engines bfdb,rocksdb-blob,fjall-blob,redb --value-sizes 1024,8192,65536,1048576 \
//!     --raw-mib 2048 --memory-mib 128 --workloads a,c --theta 0.99 --cgroup \
//!     --cgroup-allowance-mib 128
//! ```
//!
//! `--value-sizes` runs the whole comparison at each value size in turn (`--raw-mib` scales
//! the records so every size loads the same bytes), and the summary ends with a table of
//! throughput, the data directory's device bytes per operation, device bytes written per
//! byte of user data, and the directory's allocated size per byte of live data.
//!
//! `--durability none|logged|synced` sets how durable each write is (bfdb as a `Db` with one
//! keyspace; `bfdb-tree` is the plain `Tree` with no log; `bfdb-hash` a `Db` with one hash
//! keyspace, for point workloads: the driver skips its workloads with scans), and
//! `--recovery` times a reopen after each engine's run, which ends without a clean close.
//!
//! Each engine runs in its own child process (the driver re-executes itself with a hidden
//! `--child ENGINE`), so no engine inherits another's memory or page cache. The child loads
//! the records, then runs each workload at each thread count and prints one line per
//! result; the parent prints the table and the ratios against bfdb, and writes CSV files
//! and PNG bar charts under `--out`: one per workload family (load, read, write, scan, mix),
//! each on its own axis, and one per thread count with throughput relative to bf-tree. With `--cgroup` (root, cgroup v1 memory controller)
//! each child is capped at the memory budget plus `--cgroup-allowance-mib`, so the OS page
//! cache cannot give a buffered engine more memory than the budget.

mod child;
mod engines;
mod keygen;
mod report;

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{ArgAction, Parser};

use engines::EngineSpec;
use keygen::{Distribution, InsertOrder, Workload};
use report::{Line, LoadRow, RecoveryRow, RunRow};

/// Compares bfdb's Tree with other key-value engines on YCSB-like workloads.
#[derive(Parser, Clone, Debug)]
#[command(
    version,
    // Not the crate's description (which names parts not built yet): what this driver does.
    about = "YCSB-like benchmark of bfdb's Tree (a Bf-Tree range index) and HashStore (an \
             F2-style hash keyspace) against the Bf-Tree reference crate, RwLock<BTreeMap> \
             and, behind cargo features, RocksDB, sled, fjall and redb",
    args_override_self = true
)]
pub struct Options {
    /// Engines to compare, in order: bfdb (a `Db` in file mode, `Tree::in_memory` with
    /// --in-memory), bfdb-hash (a `Db` with one `HashStore`, which gets the memory budget;
    /// point operations only, so workloads with scans are skipped for it; its cold tier in
    /// hash-ordered runs, the default; bfdb-hash-log is the same with the F2 paper's cold
    /// log and chunk index, `ColdLayout::Log`), bfdb-tree (a
    /// plain `Tree` on a scratch file, no log), bftree, btreemap, and with the cargo
    /// features of the same names rocksdb, sled, fjall, redb, oxifaster (FASTER's store,
    /// point workloads only); rocksdb-blob (feature rocksdb: blob files for values of
    /// 2048 B and more, blob GC on) and fjall-blob (feature fjall: key-value separation at
    /// the same threshold). An engine may name its own durability:
    /// `bfdb:logged,bfdb:none`.
    #[arg(long, value_delimiter = ',', default_value = "bfdb,bftree,btreemap")]
    pub engines: Vec<String>,
    /// How durable a write is when it returns, for engines that do not name their own:
    /// `none` (no log), `logged` (logged, synced in the background), `synced` (on stable
    /// storage when it returns). bftree, btreemap, bfdb-tree and sled have only `none`.
    #[arg(long, value_enum, default_value = "none")]
    pub durability: engines::Durability,
    /// After each engine's run, end its child without a clean close (as a crash would) and
    /// time a second child that only opens the engine on the files left behind: the
    /// recovery after the run (engines that cannot reopen their files are skipped).
    #[arg(long)]
    pub recovery: bool,
    /// Workloads to run after the load, in order, on the same data: YCSB a-f, read, update,
    /// insert, scan, mix (50% reads, 50% updates).
    #[arg(long, value_delimiter = ',', default_value = "read,update,scan,mix")]
    pub workloads: Vec<Workload>,
    /// Records loaded before the workloads run.
    #[arg(long, default_value_t = 2_000_000)]
    pub records: u64,
    /// Key width in bytes (at least 8).
    #[arg(long, default_value_t = 16)]
    pub key_bytes: usize,
    /// Value width in bytes.
    #[arg(long, default_value_t = 16)]
    pub value_bytes: usize,
    /// Value widths to run the whole comparison at, one after another, each with every
    /// engine (the load and every workload; instead of --value-bytes), e.g.
    /// `1024,8192,65536,1048576`. The summary gives each size's tables and then one table
    /// of throughput, device bytes and space for every size.
    #[arg(long, value_delimiter = ',')]
    pub value_sizes: Vec<usize>,
    /// Load this many MiB of keys and values at each value size, instead of --records:
    /// records = raw ÷ (key + value bytes), so larger values get fewer records and every
    /// size has the same raw size.
    #[arg(long)]
    pub raw_mib: Option<u64>,
    /// Key order of the records: `hashed` (scrambled: the load inserts in random key
    /// order) or `ordered` (the load inserts in ascending key order), as YCSB's
    /// `insertorder`.
    #[arg(long, value_enum, default_value = "hashed")]
    pub insert_order: InsertOrder,
    /// Which records the operations touch.
    #[arg(long, value_enum, default_value = "zipf")]
    pub distribution: Distribution,
    /// Zipf exponent, strictly between 0 and 1 (zipf and latest).
    #[arg(long, default_value_t = 0.9)]
    pub theta: f64,
    /// Hotspot: share of the records that is hot.
    #[arg(long, default_value_t = 0.2)]
    pub hot_set_fraction: f64,
    /// Hotspot: share of the operations that go to the hot records.
    #[arg(long, default_value_t = 0.8)]
    pub hot_op_fraction: f64,
    /// Worker thread counts; every workload runs once at each. Many more threads than
    /// cores is fine: with blocking IO, threads are how queue depth is reached.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    pub threads: Vec<usize>,
    /// Threads that load the records.
    #[arg(long, default_value_t = 2)]
    pub load_threads: usize,
    /// Seconds each workload runs at each thread count (ignored with --ops).
    #[arg(long, default_value_t = 5.0)]
    pub duration_secs: f64,
    /// Run a fixed number of operations per workload and thread count instead of a time.
    #[arg(long)]
    pub ops: Option<u64>,
    /// Seconds each row first runs its workload at its thread count without measuring
    /// (0: none), so that the row measures a steady state rather than the work the load
    /// or the row before left behind (for bfdb-hash, the compaction passes that follow
    /// a load; for the trees, the pool's turnover from one key mix to the next).
    #[arg(long, default_value_t = 0.0)]
    pub warmup_secs: f64,
    /// Memory budget in MiB: bfdb's and bf-tree's circular buffer, bfdb-hash's HashStore
    /// (its indexes, read cache and log pages), RocksDB's memtables and caches (block,
    /// row or blob), fjall's cache and memtables, sled's and redb's caches.
    /// RwLock<BTreeMap> has none.
    #[arg(long, default_value_t = 8)]
    pub memory_mib: u64,
    /// bfdb-hash: the disk budget of the HashStore's hot log in MiB (its
    /// `hot_log_disk_bytes`; past 80% of it the oldest records move to the cold log). By
    /// default as many records as the hot index's share of the budget indexes without
    /// overflow buckets (a sixth of the budget in 64-byte buckets, a power of two of them,
    /// of 4 keys each), so that the store stays within the budget; the rest go to the cold
    /// log.
    #[arg(long)]
    pub hash_hot_log_mib: Option<u64>,
    /// bfdb-hash: the HashStore's read cache in MiB (its `read_cache_bytes`; 0 turns it
    /// off and gives its share to the hot log's pages). By default the store's share, a
    /// third of the budget.
    #[arg(long)]
    pub hash_read_cache_mib: Option<u64>,
    /// bfdb and bfdb-hash: the `Db`'s background checkpoint trigger, in MiB of log
    /// written since the last checkpoint (`DbOptions::checkpoint_log_bytes`; 0 turns it
    /// off). The default is the `Db`'s own (64 MiB).
    #[arg(long)]
    pub checkpoint_log_mib: Option<u64>,
    /// bfdb-hash: threads a compaction pass runs on (the HashStore's
    /// `compaction_threads`). Each waits on its own disk reads of cold-index chunks, so
    /// more threads keep more reads in flight.
    #[arg(long, default_value_t = 2)]
    pub hash_compaction_threads: usize,
    /// Operations a thread takes together: the reads among them go to the engine as one
    /// multi-key read (bfdb's `get_many`, RocksDB's `multi_get`; the others read key by
    /// key), so that an engine that batches keeps that many disk reads in flight per
    /// thread; the writes run one by one before the reads. 1 is one operation at a time.
    /// A read's latency is its batch's.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Data directory (a fresh temporary directory, removed afterwards, if not given). Each
    /// engine gets a subdirectory, removed after its run.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Bypass the OS page cache where the engine can (bfdb, bf-tree, RocksDB).
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub direct_io: bool,
    /// Keep leaf pages in memory (bfdb `Tree::in_memory`, bf-tree's Memory backend) instead
    /// of in files.
    #[arg(long)]
    pub in_memory: bool,
    /// Use bf-tree's io_uring backend instead of its O_DIRECT pread/pwrite one.
    #[arg(long)]
    pub bftree_io_uring: bool,
    /// bfdb's backend with direct IO on: `auto` (what users get by default: io_uring
    /// where the kernel allows it), `io-uring`, or `std-direct` (O_DIRECT pread/pwrite).
    #[arg(long, default_value = "auto", value_parser = ["auto", "io-uring", "std-direct"])]
    pub bfdb_backend: String,
    /// bfdb and bfdb-hash: the percent of the budget (of what the hash stores leave)
    /// that caches values kept out of line once the database holds one
    /// (`Config::value_cache_percent`; 0 turns the cache off). By default the `Config`'s.
    #[arg(long)]
    pub bfdb_value_cache_percent: Option<u8>,
    /// Records per scan.
    #[arg(long, default_value_t = 32)]
    pub scan_length: usize,
    /// Cap each child's memory (cgroup v1 memory controller, needs root) at the budget plus
    /// --cgroup-allowance-mib.
    #[arg(long)]
    pub cgroup: bool,
    /// What the cgroup allows beyond the budget: the driver's and the engine's own heap
    /// (thread stacks, histograms, inner nodes and the mapping table, the binary).
    #[arg(long, default_value_t = 64)]
    pub cgroup_allowance_mib: u64,
    /// With --cgroup: cap every child at this many MiB instead (the same memory for
    /// every engine, whatever its budget), so that engines that leave their reads to
    /// the OS page cache get no more memory than the others.
    #[arg(long)]
    pub memory_cap_mib: Option<u64>,
    /// One engine's memory budget in MiB, if not --memory-mib: `ENGINE=MIB` (an
    /// --engines name, without a durability level), repeated for more. With
    /// --memory-cap-mib, the cap less what the engine holds outside its budget, so
    /// that each engine fits the same cap.
    #[arg(long = "engine-memory-mib", value_parser = parse_engine_memory)]
    pub engine_memory_mib: Vec<(String, u64)>,
    /// Directory for results.csv, load.csv, summary.txt and the PNG charts: <family>.png
    /// per workload family and vs-bftree-<N>threads.png (default target/ycsb/<UTC
    /// timestamp>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the engine's own counters (bfdb's `TreeStats`) on stderr after the load and
    /// after every run.
    #[arg(long)]
    pub stats: bool,
    /// Seed of the key and operation choices.
    #[arg(long, default_value_t = 0x5EED)]
    pub seed: u64,
    /// A tiny run for CI: 20,000 records, 1 MiB budget, 4,000 operations per workload.
    #[arg(long)]
    pub small: bool,
    /// Internal: run as the child process for this engine.
    #[arg(long, hide = true)]
    pub child: Option<String>,
    /// Internal: the child only opens the engine on the files a run left, and reports.
    #[arg(long, hide = true)]
    pub recover_only: bool,
}

fn main() {
    let mut options = Options::parse();
    if options.small {
        // A child gets its record count from the parent (`--records`, appended last).
        if options.child.is_none() {
            options.records = 20_000;
            options.raw_mib = None;
        }
        options.memory_mib = 1;
        options.ops = Some(4_000);
    }
    let result = match options.child.clone() {
        Some(engine) => EngineSpec::parse(&engine, options.durability).and_then(|spec| {
            if options.recover_only {
                child::recover(&options, &spec)
            } else {
                child::main(&options, &spec)
            }
        }),
        None => parent(&options),
    };
    if let Err(e) = result {
        eprintln!("ycsb: {e}");
        std::process::exit(1);
    }
}

/// Parses `ENGINE=MIB` of --engine-memory-mib.
fn parse_engine_memory(text: &str) -> Result<(String, u64), String> {
    let (engine, mib) = text
        .split_once('=')
        .ok_or_else(|| format!("{text}: expected ENGINE=MIB"))?;
    let mib = mib
        .parse()
        .map_err(|e| format!("{text}: {mib:?} is not a number of MiB: {e}"))?;
    Ok((engine.to_string(), mib))
}

impl Options {
    /// The memory budget of engine `name` in MiB.
    pub fn memory_mib_of(&self, name: &str) -> u64 {
        self.engine_memory_mib
            .iter()
            .rev()
            .find(|(engine, _)| engine == name)
            .map_or(self.memory_mib, |&(_, mib)| mib)
    }
}

fn validate(options: &Options) -> Result<(), String> {
    if options.key_bytes < 8 {
        return Err("--key-bytes must be at least 8 (keys carry a 64-bit scrambled index)".into());
    }
    if options.value_bytes == 0 || options.value_sizes.contains(&0) {
        return Err("--value-bytes and --value-sizes must be at least 1".into());
    }
    if options.records == 0 {
        return Err("--records must be at least 1".into());
    }
    if options.raw_mib == Some(0) {
        return Err("--raw-mib must be at least 1".into());
    }
    if options.threads.is_empty() || options.threads.contains(&0) {
        return Err("--threads needs counts of at least 1".into());
    }
    for size in sizes(options) {
        keygen::Zipf::new(size.records, options.theta)?;
    }
    let specs = engine_specs(options)?;
    for (engine, _) in &options.engine_memory_mib {
        if !specs.iter().any(|s| &s.name == engine) {
            return Err(format!(
                "--engine-memory-mib names {engine}, which is not among --engines"
            ));
        }
    }
    for (i, spec) in specs.iter().enumerate() {
        spec.check(options.in_memory)?;
        if specs[..i]
            .iter()
            .any(|s| s.name == spec.name && s.durability == spec.durability)
        {
            return Err(format!(
                "engine {} is listed twice at durability {}",
                spec.name,
                spec.durability.name()
            ));
        }
    }
    Ok(())
}

/// One value size of a run and the records loaded at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Size {
    value_bytes: usize,
    records: u64,
}

/// The value sizes to run (`--value-sizes`, else `--value-bytes`), each with its record
/// count (from `--raw-mib` if given, else `--records`).
fn sizes(options: &Options) -> Vec<Size> {
    let values = if options.value_sizes.is_empty() {
        vec![options.value_bytes]
    } else {
        options.value_sizes.clone()
    };
    values
        .into_iter()
        .map(|value_bytes| Size {
            value_bytes,
            records: match options.raw_mib {
                Some(mib) => ((mib << 20) / (options.key_bytes + value_bytes) as u64).max(1),
                None => options.records,
            },
        })
        .collect()
}

/// The engines of `--engines`, each with its durability.
fn engine_specs(options: &Options) -> Result<Vec<EngineSpec>, String> {
    options
        .engines
        .iter()
        .map(|e| EngineSpec::parse(e, options.durability))
        .collect()
}

/// Now as `YYYYMMDD-HHMMSS` in UTC.
fn utc_timestamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    utc_timestamp_of(secs)
}

/// `YYYYMMDD-HHMMSS` in UTC for seconds since the Unix epoch (civil-from-days, Hinnant's
/// algorithm), without a date crate.
fn utc_timestamp_of(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or("?".into(), |kib| {
            format!("{:.1} GiB", kib as f64 / (1 << 20) as f64)
        });
    format!("{cores} cores ({cpu}), {mem} RAM")
}

/// Best effort: empty the OS page cache so an engine does not start with another's pages
/// (needs root; silently skipped otherwise).
fn drop_page_cache() -> bool {
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// A cgroup v1 memory group for one child, removed on drop.
struct Cgroup {
    path: PathBuf,
}

const CGROUP_ROOT: &str = "/sys/fs/cgroup/memory";

impl Cgroup {
    fn create(engine: &str, limit_bytes: u64) -> Result<Cgroup, String> {
        let path =
            Path::new(CGROUP_ROOT).join(format!("bfdb-ycsb-{}-{engine}", std::process::id()));
        std::fs::create_dir(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let group = Cgroup { path };
        std::fs::write(
            group.path.join("memory.limit_in_bytes"),
            limit_bytes.to_string(),
        )
        .map_err(|e| format!("cannot set memory.limit_in_bytes: {e}"))?;
        Ok(group)
    }

    fn add(&self, pid: u32) -> Result<(), String> {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string())
            .map_err(|e| format!("cannot move pid {pid} into {}: {e}", self.path.display()))
    }

    /// Times the group hit its limit (the kernel reclaimed or OOM-killed).
    fn failcnt(&self) -> u64 {
        std::fs::read_to_string(self.path.join("memory.failcnt"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The child has exited; the kernel may still be detaching it for a moment.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!("ycsb: could not remove the cgroup {}", self.path.display());
    }
}

/// What one child produced.
struct ChildOutcome {
    load: Option<LoadRow>,
    runs: Vec<RunRow>,
    recovery: Option<RecoveryRow>,
    /// Why the child did not finish, if it did not.
    failure: Option<String>,
}

/// Runs the child of `engine` (an `--engines` entry) on `dir`: the load and the runs, or
/// with `recover_only` only an open of what an earlier child left there.
fn run_child(
    engine: &str,
    dir: &Path,
    size: Size,
    cgroup: Option<&Cgroup>,
    recover_only: bool,
) -> Result<ChildOutcome, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the driver binary: {e}"))?;
    let mut command = Command::new(exe);
    // Options given last win (`args_override_self`): the child's directory and its size.
    command
        .args(std::env::args_os().skip(1))
        .arg("--child")
        .arg(engine)
        .arg("--dir")
        .arg(dir)
        .arg("--value-bytes")
        .arg(size.value_bytes.to_string())
        .arg("--records")
        .arg(size.records.to_string());
    if recover_only {
        command.arg("--recover-only");
    }
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start the {engine} child: {e}"))?;
    // The child waits for this line before it opens the engine, so it is in the cgroup
    // before it allocates anything that counts.
    if let Some(Err(e)) = cgroup.map(|group| group.add(child.id())) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"go\n");
    }
    let stdout = child.stdout.take().expect("stdout was piped");
    let mut outcome = ChildOutcome {
        load: None,
        runs: Vec::new(),
        recovery: None,
        failure: None,
    };
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        match report::parse_line(&line) {
            Some(Line::Load(l)) => {
                let per_record = |bytes: u64| bytes as f64 / l.records.max(1) as f64;
                println!(
                    "  {engine}: loaded {} records in {:.1} s: {} records/s, \
                     {:.0} B/record read, {:.0} B/record written, {:.2} µs/record CPU, \
                     {} MiB on disk, {}",
                    l.records,
                    l.secs,
                    report::si(l.ops_per_sec),
                    per_record(l.read_bytes),
                    per_record(l.write_bytes),
                    l.cpu_us_per_record,
                    report::mib(l.data_bytes),
                    l.mode
                );
                outcome.load = Some(l);
            }
            Some(Line::Run(mut r)) => {
                r.cgroup = cgroup.is_some();
                println!(
                    "  {engine}: {:<6} {:>3} threads {:>7} ops/s  latency p50 {:.2} µs/op, \
                     p99 {:.2} µs/op  {:.0} B/op read, {:.0} B/op written  {:.1} µs/op CPU",
                    r.workload,
                    r.threads,
                    report::si(r.ops_per_sec),
                    r.p50_us,
                    r.p99_us,
                    r.read_bytes_per_op,
                    r.write_bytes_per_op,
                    r.cpu_us_per_op
                );
                outcome.runs.push(r);
            }
            Some(Line::Recovery(r)) => {
                println!("  {engine}: recovery after the run: {}", r.describe());
                outcome.recovery = Some(r);
            }
            None => println!("  {engine}: {line}"),
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for the {engine} child: {e}"))?;
    if !status.success() {
        use std::os::unix::process::ExitStatusExt;
        let why = match status.signal() {
            Some(9) if cgroup.is_some_and(|g| g.failcnt() > 0) => {
                "killed by SIGKILL: the cgroup's memory limit was hit (OOM killer)".to_string()
            }
            Some(sig) => format!("killed by signal {sig}"),
            None => format!("exited with {status}"),
        };
        let failure = format!("the {engine} child {why}; its results so far are kept");
        eprintln!("ycsb: {failure}");
        outcome.failure = Some(failure);
    }
    Ok(outcome)
}

fn parent(options: &Options) -> Result<(), String> {
    validate(options)?;
    let temp;
    let base = match &options.dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .map_err(|e| format!("cannot create {}: {e}", d.display()))?;
            d.clone()
        }
        None => {
            temp = tempfile::Builder::new()
                .prefix("bfdb-ycsb-")
                .tempdir()
                .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
            temp.path().to_path_buf()
        }
    };
    let out = options.out.clone().unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/ycsb")
            .join(utc_timestamp())
    });
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;

    let mut amount = match options.ops {
        Some(n) => format!("{n} operations"),
        None => format!("{} s", options.duration_secs),
    };
    if options.warmup_secs > 0.0 {
        let _ = write!(amount, " after {} s unmeasured", options.warmup_secs);
    }
    let mut header = String::new();
    let _ = writeln!(header, "machine: {}", machine());
    let _ = writeln!(
        header,
        "workloads: {} with {:?} keys{}; threads {:?}; {amount} each; scan length {}; \
         direct IO {}; cgroup {}",
        options
            .workloads
            .iter()
            .map(|w| w.name())
            .collect::<Vec<_>>()
            .join(","),
        options.distribution,
        if options.distribution == Distribution::Zipf {
            format!(" (theta {})", options.theta)
        } else {
            String::new()
        },
        options.threads,
        options.scan_length,
        if options.direct_io { "on" } else { "off" },
        if let (true, Some(cap)) = (options.cgroup, options.memory_cap_mib) {
            format!("on (limit {cap} MiB for every engine)")
        } else if options.cgroup {
            format!(
                "on (limit = budget + {} MiB allowance)",
                options.cgroup_allowance_mib
            )
        } else {
            "off".into()
        }
    );
    let _ = writeln!(
        header,
        "durability: {} (engines may name their own: engine:level){}",
        options.durability.name(),
        if options.recovery {
            "; recovery after each run timed"
        } else {
            ""
        }
    );
    let _ = writeln!(header, "data directory: {}", base.display());
    print!("{header}");

    let sizes = sizes(options);
    let with_text = report::register_font();
    let mut summary = header.clone();
    let (mut loads, mut runs, mut recoveries) = (Vec::new(), Vec::new(), Vec::new());
    for &size in &sizes {
        // With several sizes, each size's charts go to a directory of its own.
        let size_out = if sizes.len() > 1 {
            out.join(format!("value-{}B", size.value_bytes))
        } else {
            out.clone()
        };
        std::fs::create_dir_all(&size_out)
            .map_err(|e| format!("cannot create {}: {e}", size_out.display()))?;
        let result = run_size(options, size, &base, &size_out, with_text)?;
        summary.push('\n');
        summary.push_str(&result.text);
        loads.extend(result.loads);
        runs.extend(result.runs);
        recoveries.extend(result.recoveries);
    }
    let amplification = format!(
        "\nthroughput, device bytes and space, by value size (dev: the data directory's \
         device, /proc/diskstats, every process's IO on it; dev wr ÷ user: device bytes \
         written ÷ key and value bytes the phase wrote; dir: the directory's allocated \
         blocks after the phase; live: records × (key + value bytes))\n{}",
        report::amplification_table(&runs, &loads)
    );
    print!("{amplification}");
    summary.push_str(&amplification);

    report::write_csv(&out, &runs, &loads, &recoveries).map_err(|e| format!("writing CSV: {e}"))?;
    std::fs::write(out.join("summary.txt"), &summary).map_err(|e| format!("summary: {e}"))?;
    println!("results: {}", out.display());
    Ok(())
}

/// What the engines did at one value size.
struct SizeResult {
    /// The size's part of the summary: its records and regime, its tables, modes, notes.
    text: String,
    loads: Vec<LoadRow>,
    runs: Vec<RunRow>,
    recoveries: Vec<RecoveryRow>,
}

/// Bytes an ideal cache spends on a record beside its key and value: a 16-byte header
/// and an 8-byte index entry.
const IDEAL_RECORD_OVERHEAD_BYTES: u64 = 24;

/// What a cache of `budget_bytes` that always held the most frequent records (the best
/// any policy can do when keys are drawn independently) would do under the run's Zipf
/// distribution: the records it holds and the share of reads it would miss.
fn ideal_cache(options: &Options, size: Size, budget_bytes: u64) -> (u64, f64) {
    let record = (options.key_bytes + size.value_bytes) as u64 + IDEAL_RECORD_OVERHEAD_BYTES;
    let cached = (budget_bytes / record).min(size.records);
    let zeta = |n: u64| keygen::zeta(n, options.theta);
    (cached, 1.0 - zeta(cached) / zeta(size.records))
}

/// Runs every engine at `size`, one child after another; prints the size's tables and
/// draws its charts under `out`.
fn run_size(
    options: &Options,
    size: Size,
    base: &Path,
    out: &Path,
    with_text: bool,
) -> Result<SizeResult, String> {
    let budget_bytes = options.memory_mib << 20;
    let raw_bytes = size.records * (options.key_bytes + size.value_bytes) as u64;
    let regime = if options.in_memory {
        "in memory: leaf pages kept in memory, the budget bounds the caches".to_string()
    } else if raw_bytes > budget_bytes {
        let mut regime = format!(
            "larger than memory: raw data is {:.1}× the budget",
            raw_bytes as f64 / budget_bytes as f64
        );
        if options.distribution == Distribution::Zipf {
            let (cached, miss) = ideal_cache(options, size, budget_bytes);
            let _ = write!(
                regime,
                "; an ideal cache of the budget ({cached} records of {} B: key, value and \
                 {IDEAL_RECORD_OVERHEAD_BYTES} B of header and index entry, the most \
                 frequent ones) would miss {:.1}% of reads",
                options.key_bytes + size.value_bytes + IDEAL_RECORD_OVERHEAD_BYTES as usize,
                miss * 100.0
            );
        }
        regime
    } else {
        "in memory: the data fits in the budget".to_string()
    };
    let mut text = String::new();
    let _ = writeln!(
        text,
        "records: {} × ({} B key + {} B value) = {} MiB raw, loaded in {} key order; \
         budget {} MiB{}; {regime}",
        size.records,
        options.key_bytes,
        size.value_bytes,
        report::mib(raw_bytes),
        match options.insert_order {
            InsertOrder::Hashed => "random (hashed)",
            InsertOrder::Ordered => "ascending (ordered)",
        },
        options.memory_mib,
        options
            .engine_memory_mib
            .iter()
            .map(|(engine, mib)| format!(", {engine} {mib} MiB"))
            .collect::<String>()
    );
    print!("\n{text}");
    let header_len = text.len();

    let mut loads = Vec::new();
    let mut runs = Vec::new();
    let mut recoveries = Vec::new();
    let mut notes = Vec::new();
    for spec in engine_specs(options)? {
        let engine = spec.label.as_str();
        if !drop_page_cache() {
            notes.push("the page cache was not dropped between engines (needs root)".to_string());
        }
        // `bfdb:synced` → `bfdb-synced`: a plain name for the directory and the cgroup.
        let plain = engine.replace(':', "-");
        let dir = base.join(&plain);
        let _ = std::fs::remove_dir_all(&dir);
        let cgroup = if options.cgroup {
            let limit = options.memory_cap_mib.map_or(
                (options.memory_mib_of(&spec.name) + options.cgroup_allowance_mib) << 20,
                |cap| cap << 20,
            );
            match Cgroup::create(&plain, limit) {
                Ok(g) => Some(g),
                Err(e) => {
                    let note = format!("{engine} ran without a cgroup: {e}");
                    eprintln!("ycsb: {note}");
                    notes.push(note);
                    None
                }
            }
        } else {
            None
        };
        println!("{engine}:");
        let skipped: Vec<&str> = options
            .workloads
            .iter()
            .filter(|&&w| !engines::runs_workload(&spec.name, w))
            .map(|w| w.name())
            .collect();
        if !skipped.is_empty() {
            let note = format!(
                "{engine}: workloads {} skipped: they scan, and {} has no range scans",
                skipped.join(","),
                spec.name
            );
            println!("  {note}");
            notes.push(note);
        }
        let finished = match run_child(engine, &dir, size, cgroup.as_ref(), false) {
            Ok(outcome) => {
                loads.extend(outcome.load);
                runs.extend(outcome.runs);
                let finished = outcome.failure.is_none();
                notes.extend(outcome.failure);
                finished
            }
            Err(e) => {
                eprintln!("ycsb: {e}");
                notes.push(e);
                false
            }
        };
        if options.recovery && finished {
            if !engines::reopens(&spec.name, options.in_memory) {
                notes.push(format!(
                    "{engine}: no recovery after the run (its files do not reopen)"
                ));
            } else {
                // A cold page cache, as after a crash of the machine.
                drop_page_cache();
                match run_child(engine, &dir, size, cgroup.as_ref(), true) {
                    Ok(outcome) => {
                        recoveries.extend(outcome.recovery);
                        notes.extend(outcome.failure);
                    }
                    Err(e) => {
                        eprintln!("ycsb: {e}");
                        notes.push(e);
                    }
                }
            }
        }
        drop(cgroup);
        let _ = std::fs::remove_dir_all(&dir);
    }
    notes.dedup();

    text.push('\n');
    text.push_str(&report::load_table(&loads));
    text.push('\n');
    text.push_str(&report::run_table(&runs));
    if let Some((reference, ratios)) = report::ratio_table(&runs, &loads) {
        text.push_str(&format!(
            "\n{reference}'s throughput divided by each engine's (above 1: {reference} is faster)\n"
        ));
        text.push_str(&ratios);
    }
    if !recoveries.is_empty() {
        text.push_str(
            "\nrecovery after the run (the child ended without a clean close; page cache dropped)\n",
        );
        text.push_str(&report::recovery_table(&recoveries));
    }
    let modes: Vec<String> = loads
        .iter()
        .map(|l| {
            format!(
                "{}: {}{}",
                l.engine,
                l.mode,
                if options.cgroup {
                    ", cgroup-capped"
                } else {
                    ""
                }
            )
        })
        .collect();
    text.push_str("\nmodes:\n");
    for m in &modes {
        text.push_str(&format!("  {m}\n"));
    }
    for n in &notes {
        text.push_str(&format!("note: {n}\n"));
    }
    println!();
    print!("{}", &text[header_len..]);

    let title = format!(
        "{} records of {} B, {} MiB budget, {:?}",
        size.records, size.value_bytes, options.memory_mib, options.distribution
    );
    match report::draw_charts(out, &runs, &loads, &title, with_text) {
        Ok(files) if !files.is_empty() => println!(
            "charts: {}{}",
            files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            if with_text {
                ""
            } else {
                " (drawn without text: no DejaVu font found under /usr/share/fonts)"
            }
        ),
        Ok(_) => {}
        Err(e) => eprintln!("ycsb: drawing charts failed: {e}"),
    }
    Ok(SizeResult {
        text,
        loads,
        runs,
        recoveries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_civil_utc() {
        assert_eq!(utc_timestamp_of(0), "19700101-000000");
        // 2000-02-29 12:34:56 UTC: a leap day in a year divisible by 400.
        assert_eq!(utc_timestamp_of(951_827_696), "20000229-123456");
        assert_eq!(utc_timestamp_of(1_763_780_000), "20251122-025320");
    }

    #[test]
    fn an_ideal_cache_holds_the_budgets_worth_of_the_most_frequent_records() {
        let o = Options::try_parse_from(["ycsb", "--key-bytes", "8", "--theta", "0.99"]).unwrap();
        let size = |records| Size {
            value_bytes: 100,
            records,
        };
        // 132-byte records: 1,000 fit in 132,000 bytes; all 1,000 of them miss nothing.
        assert_eq!(ideal_cache(&o, size(1_000), 132_000), (1_000, 0.0));
        // A tenth of 20M records, the most frequent ones: about 14% of reads miss
        // (1 - zeta(2M) / zeta(20M) at theta 0.99); a smaller cache misses more.
        let (cached, miss) = ideal_cache(&o, size(20_000_000), 2_000_000 * 132);
        assert_eq!(cached, 2_000_000);
        assert!((0.13..0.15).contains(&miss), "{miss}");
        assert!(ideal_cache(&o, size(20_000_000), 1_000_000 * 132).1 > miss);
    }

    #[test]
    fn options_parse_lists_and_reject_bad_values() {
        let o = Options::try_parse_from([
            "ycsb",
            "--engines",
            "bfdb,btreemap",
            "--threads",
            "2,16",
            "--workloads",
            "a,scan",
            "--direct-io",
            "false",
            "--dir",
            "/tmp/a",
            "--dir",
            "/tmp/b",
        ])
        .unwrap();
        assert_eq!(o.engines, ["bfdb", "btreemap"]);
        assert_eq!(o.threads, [2, 16]);
        assert_eq!(o.workloads, [Workload::A, Workload::Scan]);
        assert!(!o.direct_io);
        // The child's --dir, appended last, wins over the user's.
        assert_eq!(o.dir.as_deref(), Some(Path::new("/tmp/b")));
        validate(&o).unwrap();
        let bad = |args: &[&str]| {
            let o = Options::try_parse_from(args).unwrap();
            validate(&o).is_err()
        };
        assert!(bad(&["ycsb", "--key-bytes", "4"]));
        assert!(bad(&["ycsb", "--engines", "mysql"]));
        assert!(bad(&["ycsb", "--threads", "0"]));
        assert!(bad(&["ycsb", "--theta", "1.5"]));
        assert!(Options::try_parse_from(["ycsb", "--workloads", "g"]).is_err());
    }

    #[test]
    fn durability_defaults_to_none_and_engines_may_name_their_own() {
        use engines::Durability;
        let o = Options::try_parse_from(["ycsb"]).unwrap();
        assert_eq!(o.durability, Durability::None);
        assert!(!o.recovery);
        validate(&o).unwrap();

        let o = Options::try_parse_from([
            "ycsb",
            "--durability",
            "synced",
            "--engines",
            "bfdb,rocksdb,bftree:none,bfdb:logged",
            "--recovery",
        ])
        .unwrap();
        assert_eq!(o.durability, Durability::Synced);
        assert!(o.recovery);
        let specs = engine_specs(&o).unwrap();
        let got: Vec<(&str, Durability, &str)> = specs
            .iter()
            .map(|s| (s.name.as_str(), s.durability, s.label.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("bfdb", Durability::Synced, "bfdb"),
                ("rocksdb", Durability::Synced, "rocksdb"),
                ("bftree", Durability::None, "bftree:none"),
                ("bfdb", Durability::Logged, "bfdb:logged"),
            ]
        );
        validate(&o).unwrap();
        assert!(Options::try_parse_from(["ycsb", "--durability", "fsync"]).is_err());
    }

    #[test]
    fn value_sizes_scale_the_records_to_the_raw_size() {
        let o = Options::try_parse_from(["ycsb", "--records", "500"]).unwrap();
        assert_eq!(
            sizes(&o),
            [Size {
                value_bytes: 16,
                records: 500
            }]
        );
        let o = Options::try_parse_from([
            "ycsb",
            "--value-sizes",
            "1024,8192,65536,1048576",
            "--raw-mib",
            "1024",
        ])
        .unwrap();
        validate(&o).unwrap();
        let got: Vec<(usize, u64)> = sizes(&o)
            .iter()
            .map(|s| (s.value_bytes, s.records))
            .collect();
        // 1 GiB ÷ (16-byte key + value), rounded down.
        assert_eq!(
            got,
            [
                (1024, 1_032_444),
                (8192, 130_816),
                (65536, 16_380),
                (1_048_576, 1023)
            ]
        );
        let o = Options::try_parse_from(["ycsb", "--value-sizes", "0"]).unwrap();
        assert!(validate(&o).is_err());
        // The child's --value-bytes and --records, appended last, win.
        let o = Options::try_parse_from([
            "ycsb",
            "--value-sizes",
            "1024,8192",
            "--raw-mib",
            "64",
            "--value-bytes",
            "8192",
            "--records",
            "8175",
        ])
        .unwrap();
        assert_eq!((o.value_bytes, o.records), (8192, 8175));
    }

    #[test]
    fn hash_engines_skip_the_workloads_with_scans() {
        for engine in ["bfdb-hash", "oxifaster"] {
            for w in [Workload::E, Workload::Scan] {
                assert!(!engines::runs_workload(engine, w), "{engine} {w:?}");
            }
            for w in [Workload::A, Workload::B, Workload::F, Workload::Mix] {
                assert!(engines::runs_workload(engine, w), "{engine} {w:?}");
            }
        }
        assert!(engines::runs_workload("bfdb", Workload::E));
    }

    #[test]
    fn durability_levels_an_engine_lacks_are_refused_with_the_reason() {
        let refusal = |args: &[&str]| {
            let o = Options::try_parse_from(args).unwrap();
            validate(&o).expect_err("should be refused")
        };
        // The default engines include bftree and btreemap, which have no log.
        let e = refusal(&["ycsb", "--durability", "logged"]);
        assert!(e.contains("bftree") && e.contains("no log"), "{e}");
        for engine in ["btreemap", "bfdb-tree", "sled"] {
            let e = refusal(&["ycsb", "--engines", engine, "--durability", "synced"]);
            assert!(e.contains(engine) && e.contains("only with `none`"), "{e}");
        }
        let e = refusal(&["ycsb", "--engines", "bfdb:synced", "--in-memory"]);
        assert!(e.contains("in_memory"), "{e}");
        let e = refusal(&["ycsb", "--engines", "bfdb:fsync"]);
        assert!(e.contains("unknown durability"), "{e}");
        let e = refusal(&[
            "ycsb",
            "--engines",
            "bfdb,bfdb:none",
            "--durability",
            "none",
        ]);
        assert!(e.contains("listed twice"), "{e}");
        // The hash engines keep their records in files; oxifaster logs no writes.
        let e = refusal(&["ycsb", "--engines", "bfdb-hash", "--in-memory"]);
        assert!(e.contains("bfdb-hash") && e.contains("--in-memory"), "{e}");
        let e = refusal(&["ycsb", "--engines", "oxifaster", "--durability", "logged"]);
        assert!(
            e.contains("oxifaster") && e.contains("only with `none`"),
            "{e}"
        );
        // bfdb in a Db, the plain tree and the logging engines take every level.
        for level in ["none", "logged", "synced"] {
            let o = Options::try_parse_from([
                "ycsb",
                "--engines",
                "bfdb,bfdb-hash,rocksdb,rocksdb-blob,fjall,fjall-blob,bfdb-tree:none",
                "--durability",
                level,
            ])
            .unwrap();
            validate(&o).unwrap();
        }
        // redb 4 has no commit without an fsync: none and synced only.
        for level in ["none", "synced"] {
            let o = Options::try_parse_from(["ycsb", "--engines", "redb", "--durability", level])
                .unwrap();
            validate(&o).unwrap();
        }
        let e = refusal(&["ycsb", "--engines", "redb", "--durability", "logged"]);
        assert!(e.contains("redb") && e.contains("Eventual"), "{e}");
    }
}
