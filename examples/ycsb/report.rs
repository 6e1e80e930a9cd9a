//! Results: the lines a child prints and the parent parses, the table, the ratios against
//! bfdb, the CSV files and the PNG bar charts.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

/// Prefix of the machine-readable lines a child prints on stdout.
pub const LINE_PREFIX: &str = "@ycsb";

/// What loading one engine took.
#[derive(Clone, Debug, Default)]
pub struct LoadRow {
    pub engine: String,
    pub mode: String,
    /// `none`, `logged` or `synced`.
    pub durability: String,
    pub records: u64,
    pub key_bytes: u64,
    pub value_bytes: u64,
    pub secs: f64,
    pub ops_per_sec: f64,
    /// The engine's directory after the load: apparent size and allocated blocks.
    pub data_bytes: u64,
    pub data_allocated_bytes: u64,
    /// What the process read and wrote (`/proc/self/io`).
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// What the data directory's device read and wrote during the load, a sync of the
    /// filesystem after it included (`/proc/diskstats`); `None` where unavailable.
    /// `device_reads` counts the reads the device completed.
    pub device_reads: Option<u64>,
    pub device_read_bytes: Option<u64>,
    pub device_write_bytes: Option<u64>,
    /// CPU time (user + system, all of the child's threads) per record loaded, in µs,
    /// the final flush included.
    pub cpu_us_per_record: f64,
    pub peak_rss_bytes: u64,
    pub budget_bytes: u64,
}

/// One engine × workload × thread count.
#[derive(Clone, Debug, Default)]
pub struct RunRow {
    pub engine: String,
    pub mode: String,
    /// `none`, `logged` or `synced`.
    pub durability: String,
    pub workload: String,
    pub distribution: String,
    pub threads: usize,
    pub ops: u64,
    pub secs: f64,
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// What the process read and wrote per operation (`/proc/self/io`).
    pub read_bytes_per_op: f64,
    pub write_bytes_per_op: f64,
    /// Operations that wrote a record (updates, inserts, read-modify-writes).
    pub writes: u64,
    /// What the data directory's device read and wrote during the run, a sync of the
    /// filesystem after it included (`/proc/diskstats`, every process's IO on that
    /// device); `None` where unavailable. `device_reads` counts the reads the device
    /// completed.
    pub device_reads: Option<u64>,
    pub device_read_bytes: Option<u64>,
    pub device_write_bytes: Option<u64>,
    /// Cache flushes the disk under the data directory completed per operation
    /// (`/proc/diskstats`: what fsync and fdatasync cost on a disk with a write cache).
    /// Counts every process's flushes on that disk, not only the child's.
    pub disk_flushes_per_op: f64,
    /// CPU time (user + system, all of the child's threads) per operation, in µs: less
    /// sensitive than throughput to a noisy host, since time the host steals is not
    /// counted.
    pub cpu_us_per_op: f64,
    pub peak_rss_bytes: u64,
    pub budget_bytes: u64,
    pub data_bytes_after_load: u64,
    /// The engine's directory after the run: apparent size and allocated blocks.
    pub data_bytes_after_run: u64,
    pub data_allocated_bytes_after_run: u64,
    /// Records in the engine after the run (the loaded ones and the inserted ones).
    pub records_after_run: u64,
    pub key_bytes: u64,
    pub value_bytes: u64,
    pub load_ops_per_sec: f64,
    pub not_found: u64,
    pub errors: u64,
    /// Filled in by the parent: whether the child ran in a memory cgroup.
    pub cgroup: bool,
}

fn fields_to_line(kind: &str, fields: &[(&str, String)]) -> String {
    let mut line = format!("{LINE_PREFIX}\t{kind}");
    for (k, v) in fields {
        debug_assert!(!v.contains('\t') && !v.contains('\n'));
        let _ = write!(line, "\t{k}={v}");
    }
    line
}

fn line_to_fields(line: &str) -> Option<(String, HashMap<String, String>)> {
    let mut parts = line
        .strip_prefix(LINE_PREFIX)?
        .strip_prefix('\t')?
        .split('\t');
    let kind = parts.next()?.to_string();
    let fields = parts
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Some((kind, fields))
}

/// What reopening an engine on the files its run left took (`--recovery`).
#[derive(Clone, Debug, Default)]
pub struct RecoveryRow {
    pub engine: String,
    pub mode: String,
    pub durability: String,
    /// Wall time of the engine's open, as its user waits for it.
    pub open_secs: f64,
    /// The engine's own account of its recovery (bfdb: `RecoveryStats::duration`), where
    /// it gives one; negative otherwise.
    pub engine_secs: f64,
    /// Log bytes read (bfdb), where the engine says; negative otherwise.
    pub log_bytes: i64,
    /// Log records replayed (bfdb), where the engine says; negative otherwise.
    pub records_replayed: i64,
    /// Loaded records looked up after the open, and how many were found.
    pub sampled: u64,
    pub found: u64,
    /// Disk bytes the open read and wrote.
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Bytes of the engine's files when it was reopened.
    pub data_bytes: u64,
}

impl RecoveryRow {
    /// One line for the console.
    pub fn describe(&self) -> String {
        let mut text = format!("open {:.3} s", self.open_secs);
        if self.engine_secs >= 0.0 {
            let _ = write!(text, " (the engine's recovery {:.3} s)", self.engine_secs);
        }
        if self.log_bytes >= 0 {
            let _ = write!(
                text,
                ", {} MiB of log read, {} records replayed",
                mib(self.log_bytes as u64),
                self.records_replayed
            );
        }
        let _ = write!(
            text,
            ", {} MiB read, {} MiB written; {} of {} loaded records sampled found",
            mib(self.read_bytes),
            mib(self.write_bytes),
            self.found,
            self.sampled
        );
        text
    }

    pub fn to_line(&self) -> String {
        fields_to_line(
            "recovery",
            &[
                ("engine", self.engine.clone()),
                ("mode", self.mode.clone()),
                ("durability", self.durability.clone()),
                ("open_secs", self.open_secs.to_string()),
                ("engine_secs", self.engine_secs.to_string()),
                ("log_bytes", self.log_bytes.to_string()),
                ("records_replayed", self.records_replayed.to_string()),
                ("sampled", self.sampled.to_string()),
                ("found", self.found.to_string()),
                ("read_bytes", self.read_bytes.to_string()),
                ("write_bytes", self.write_bytes.to_string()),
                ("data_bytes", self.data_bytes.to_string()),
            ],
        )
    }
}

/// A parsed line from a child.
pub enum Line {
    Load(LoadRow),
    Run(RunRow),
    Recovery(RecoveryRow),
}

fn get<T: std::str::FromStr + Default>(m: &HashMap<String, String>, k: &str) -> T {
    m.get(k).and_then(|v| v.parse().ok()).unwrap_or_default()
}

/// A field that may be missing: `None` when absent or empty.
fn get_opt<T: std::str::FromStr>(m: &HashMap<String, String>, k: &str) -> Option<T> {
    m.get(k).and_then(|v| v.parse().ok())
}

/// An optional count as a line's field: empty when unknown.
fn opt_field(v: Option<u64>) -> String {
    v.map_or(String::new(), |v| v.to_string())
}

impl LoadRow {
    pub fn to_line(&self) -> String {
        fields_to_line(
            "load",
            &[
                ("engine", self.engine.clone()),
                ("mode", self.mode.clone()),
                ("durability", self.durability.clone()),
                ("records", self.records.to_string()),
                ("key_bytes", self.key_bytes.to_string()),
                ("value_bytes", self.value_bytes.to_string()),
                ("secs", self.secs.to_string()),
                ("ops_per_sec", self.ops_per_sec.to_string()),
                ("data_bytes", self.data_bytes.to_string()),
                (
                    "data_allocated_bytes",
                    self.data_allocated_bytes.to_string(),
                ),
                ("read_bytes", self.read_bytes.to_string()),
                ("write_bytes", self.write_bytes.to_string()),
                ("device_reads", opt_field(self.device_reads)),
                ("device_read_bytes", opt_field(self.device_read_bytes)),
                ("device_write_bytes", opt_field(self.device_write_bytes)),
                ("cpu_us_per_record", self.cpu_us_per_record.to_string()),
                ("peak_rss_bytes", self.peak_rss_bytes.to_string()),
                ("budget_bytes", self.budget_bytes.to_string()),
            ],
        )
    }
}

impl RunRow {
    pub fn to_line(&self) -> String {
        fields_to_line(
            "run",
            &[
                ("engine", self.engine.clone()),
                ("mode", self.mode.clone()),
                ("durability", self.durability.clone()),
                ("workload", self.workload.clone()),
                ("distribution", self.distribution.clone()),
                ("threads", self.threads.to_string()),
                ("ops", self.ops.to_string()),
                ("secs", self.secs.to_string()),
                ("ops_per_sec", self.ops_per_sec.to_string()),
                ("p50_us", self.p50_us.to_string()),
                ("p99_us", self.p99_us.to_string()),
                ("p999_us", self.p999_us.to_string()),
                ("read_bytes_per_op", self.read_bytes_per_op.to_string()),
                ("write_bytes_per_op", self.write_bytes_per_op.to_string()),
                ("writes", self.writes.to_string()),
                ("device_reads", opt_field(self.device_reads)),
                ("device_read_bytes", opt_field(self.device_read_bytes)),
                ("device_write_bytes", opt_field(self.device_write_bytes)),
                ("disk_flushes_per_op", self.disk_flushes_per_op.to_string()),
                ("cpu_us_per_op", self.cpu_us_per_op.to_string()),
                ("peak_rss_bytes", self.peak_rss_bytes.to_string()),
                ("budget_bytes", self.budget_bytes.to_string()),
                (
                    "data_bytes_after_load",
                    self.data_bytes_after_load.to_string(),
                ),
                (
                    "data_bytes_after_run",
                    self.data_bytes_after_run.to_string(),
                ),
                (
                    "data_allocated_bytes_after_run",
                    self.data_allocated_bytes_after_run.to_string(),
                ),
                ("records_after_run", self.records_after_run.to_string()),
                ("key_bytes", self.key_bytes.to_string()),
                ("value_bytes", self.value_bytes.to_string()),
                ("load_ops_per_sec", self.load_ops_per_sec.to_string()),
                ("not_found", self.not_found.to_string()),
                ("errors", self.errors.to_string()),
            ],
        )
    }
}

/// Parses a line a child printed; `None` for anything else (passed through as text).
pub fn parse_line(line: &str) -> Option<Line> {
    let (kind, m) = line_to_fields(line)?;
    let s = |k: &str| m.get(k).cloned().unwrap_or_default();
    match kind.as_str() {
        "load" => Some(Line::Load(LoadRow {
            engine: s("engine"),
            mode: s("mode"),
            durability: s("durability"),
            records: get(&m, "records"),
            key_bytes: get(&m, "key_bytes"),
            value_bytes: get(&m, "value_bytes"),
            secs: get(&m, "secs"),
            ops_per_sec: get(&m, "ops_per_sec"),
            data_bytes: get(&m, "data_bytes"),
            data_allocated_bytes: get(&m, "data_allocated_bytes"),
            read_bytes: get(&m, "read_bytes"),
            write_bytes: get(&m, "write_bytes"),
            device_reads: get_opt(&m, "device_reads"),
            device_read_bytes: get_opt(&m, "device_read_bytes"),
            device_write_bytes: get_opt(&m, "device_write_bytes"),
            cpu_us_per_record: get(&m, "cpu_us_per_record"),
            peak_rss_bytes: get(&m, "peak_rss_bytes"),
            budget_bytes: get(&m, "budget_bytes"),
        })),
        "run" => Some(Line::Run(RunRow {
            engine: s("engine"),
            mode: s("mode"),
            durability: s("durability"),
            workload: s("workload"),
            distribution: s("distribution"),
            threads: get(&m, "threads"),
            ops: get(&m, "ops"),
            secs: get(&m, "secs"),
            ops_per_sec: get(&m, "ops_per_sec"),
            p50_us: get(&m, "p50_us"),
            p99_us: get(&m, "p99_us"),
            p999_us: get(&m, "p999_us"),
            read_bytes_per_op: get(&m, "read_bytes_per_op"),
            write_bytes_per_op: get(&m, "write_bytes_per_op"),
            writes: get(&m, "writes"),
            device_reads: get_opt(&m, "device_reads"),
            device_read_bytes: get_opt(&m, "device_read_bytes"),
            device_write_bytes: get_opt(&m, "device_write_bytes"),
            disk_flushes_per_op: get(&m, "disk_flushes_per_op"),
            cpu_us_per_op: get(&m, "cpu_us_per_op"),
            peak_rss_bytes: get(&m, "peak_rss_bytes"),
            budget_bytes: get(&m, "budget_bytes"),
            data_bytes_after_load: get(&m, "data_bytes_after_load"),
            data_bytes_after_run: get(&m, "data_bytes_after_run"),
            data_allocated_bytes_after_run: get(&m, "data_allocated_bytes_after_run"),
            records_after_run: get(&m, "records_after_run"),
            key_bytes: get(&m, "key_bytes"),
            value_bytes: get(&m, "value_bytes"),
            load_ops_per_sec: get(&m, "load_ops_per_sec"),
            not_found: get(&m, "not_found"),
            errors: get(&m, "errors"),
            cgroup: false,
        })),
        "recovery" => Some(Line::Recovery(RecoveryRow {
            engine: s("engine"),
            mode: s("mode"),
            durability: s("durability"),
            open_secs: get(&m, "open_secs"),
            engine_secs: m
                .get("engine_secs")
                .and_then(|v| v.parse().ok())
                .unwrap_or(-1.0),
            log_bytes: m
                .get("log_bytes")
                .and_then(|v| v.parse().ok())
                .unwrap_or(-1),
            records_replayed: m
                .get("records_replayed")
                .and_then(|v| v.parse().ok())
                .unwrap_or(-1),
            sampled: get(&m, "sampled"),
            found: get(&m, "found"),
            read_bytes: get(&m, "read_bytes"),
            write_bytes: get(&m, "write_bytes"),
            data_bytes: get(&m, "data_bytes"),
        })),
        _ => None,
    }
}

/// `1234567.0` → `1.23M`.
pub fn si(x: f64) -> String {
    let a = x.abs();
    if a >= 1e9 {
        format!("{:.2}G", x / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}K", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

pub fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1 << 20) as f64)
}

/// Latency in µs with sensible precision.
fn us(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// A plain-text table: the first column and the `mode` and `notes` columns left-aligned,
/// numbers right-aligned.
fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let left: Vec<bool> = header
        .iter()
        .enumerate()
        .map(|(i, h)| i == 0 || *h == "mode" || *h == "notes")
        .collect();
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: Vec<String>| {
        for (i, c) in cells.iter().enumerate() {
            let pad = width[i] - c.chars().count();
            if i == 0 {
                let _ = write!(out, "{c}{}", " ".repeat(pad));
            } else if left[i] {
                let _ = write!(out, "  {c}{}", " ".repeat(pad));
            } else {
                let _ = write!(out, "  {}{c}", " ".repeat(pad));
            }
        }
        out.push('\n');
    };
    line(&mut out, header.iter().map(|s| s.to_string()).collect());
    line(
        &mut out,
        width.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>(),
    );
    for r in rows {
        line(&mut out, r.clone());
    }
    out
}

pub fn load_table(loads: &[LoadRow]) -> String {
    let rows: Vec<Vec<String>> = loads
        .iter()
        .map(|l| {
            vec![
                l.engine.clone(),
                si(l.ops_per_sec),
                format!("{:.1}", l.secs),
                mib(l.data_bytes),
                format!("{:.0}", l.read_bytes as f64 / l.records.max(1) as f64),
                format!("{:.0}", l.write_bytes as f64 / l.records.max(1) as f64),
                format!("{:.2}", l.cpu_us_per_record),
                mib(l.peak_rss_bytes),
                mib(l.budget_bytes),
                l.mode.clone(),
            ]
        })
        .collect();
    render(
        &[
            "engine",
            "load ops/s",
            "secs",
            "data MiB",
            "rd B/rec",
            "wr B/rec",
            "cpu µs/rec",
            "peak RSS MiB",
            "budget MiB",
            "mode",
        ],
        &rows,
    )
}

pub fn run_table(runs: &[RunRow]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.engine.clone(),
                r.workload.clone(),
                r.threads.to_string(),
                si(r.ops_per_sec),
                us(r.p50_us),
                us(r.p99_us),
                us(r.p999_us),
                format!("{:.0}", r.read_bytes_per_op),
                format!("{:.0}", r.write_bytes_per_op),
                format!("{:.3}", r.disk_flushes_per_op),
                format!("{:.1}", r.cpu_us_per_op),
                mib(r.peak_rss_bytes),
                mib(r.data_bytes_after_run),
                if r.errors > 0 {
                    format!("{} errors", r.errors)
                } else if r.not_found > 0 {
                    format!("{} not found", r.not_found)
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    render(
        &[
            "engine",
            "workload",
            "thr",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "rd B/op",
            "wr B/op",
            "flush/op",
            "cpu µs/op",
            "peak RSS MiB",
            "data MiB",
            "notes",
        ],
        &rows,
    )
}

/// Bytes of keys and values in `records` records: the user data the driver knows of.
pub fn user_bytes(records: u64, key_bytes: u64, value_bytes: u64) -> u64 {
    records * (key_bytes + value_bytes)
}

/// `x / y` to two places, `-` when `y` is 0 or `x` unknown.
fn ratio_cell(x: Option<u64>, y: u64) -> String {
    match x {
        Some(x) if y > 0 => format!("{:.2}", x as f64 / y as f64),
        _ => "-".into(),
    }
}

/// Bytes per operation, `-` when unknown.
fn per_op_cell(x: Option<u64>, ops: u64) -> String {
    match x {
        Some(x) => format!("{:.0}", x as f64 / ops.max(1) as f64),
        None => "-".into(),
    }
}

/// `x` per operation with three decimals (device reads per operation), `-` if unknown.
fn fraction_cell(x: Option<u64>, ops: u64) -> String {
    match x {
        Some(x) => format!("{:.3}", x as f64 / ops.max(1) as f64),
        None => "-".into(),
    }
}

/// `x` per second of a phase of `secs` seconds, `-` if unknown.
fn rate_cell(x: Option<u64>, secs: f64) -> String {
    match x {
        Some(x) if secs > 0.0 => si(x as f64 / secs),
        _ => "-".into(),
    }
}

/// Throughput, the device's bytes and the space on disk, by value size, engine and phase
/// (the load, then each run):
///
/// - `dev rd B/op`, `dev wr B/op`: what the device under the data directory read and
///   wrote per operation (per record for the load), `/proc/diskstats`, with a sync of the
///   filesystem after the phase counted in it;
/// - `dev reads/op`, `dev reads/s`: the reads that device completed, per operation and
///   per second of the phase (to hold against the disk's limit, `examples/disk_limit.rs`);
/// - `dev wr ÷ user`: the device's bytes written divided by the bytes of keys and values
///   the phase wrote (the load: every record; a run: its updates and inserts), `-` for a
///   phase that wrote none (YCSB C);
/// - `dir MiB`: the engine's directory as allocated blocks (`du`), after the phase;
/// - `dir ÷ live`, `apparent ÷ live`: the directory's allocated and apparent size
///   divided by the live data, records × (key + value bytes).
pub fn amplification_table(runs: &[RunRow], loads: &[LoadRow]) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let sizes = dedup(
        loads
            .iter()
            .map(|l| l.value_bytes.to_string())
            .chain(runs.iter().map(|r| r.value_bytes.to_string())),
    );
    for size in &sizes {
        let engines = dedup(
            loads
                .iter()
                .filter(|l| &l.value_bytes.to_string() == size)
                .map(|l| l.engine.clone())
                .chain(
                    runs.iter()
                        .filter(|r| &r.value_bytes.to_string() == size)
                        .map(|r| r.engine.clone()),
                ),
        );
        for engine in &engines {
            let ours = |e: &str, v: u64| e == engine && &v.to_string() == size;
            for l in loads.iter().filter(|l| ours(&l.engine, l.value_bytes)) {
                let live = user_bytes(l.records, l.key_bytes, l.value_bytes);
                rows.push(vec![
                    size.clone(),
                    l.engine.clone(),
                    "load".into(),
                    String::new(),
                    si(l.ops_per_sec),
                    fraction_cell(l.device_reads, l.records),
                    rate_cell(l.device_reads, l.secs),
                    per_op_cell(l.device_read_bytes, l.records),
                    per_op_cell(l.device_write_bytes, l.records),
                    ratio_cell(l.device_write_bytes, live),
                    mib(l.data_allocated_bytes),
                    ratio_cell(Some(l.data_allocated_bytes), live),
                    ratio_cell(Some(l.data_bytes), live),
                ]);
            }
            for r in runs.iter().filter(|r| ours(&r.engine, r.value_bytes)) {
                let live = user_bytes(r.records_after_run, r.key_bytes, r.value_bytes);
                let written = user_bytes(r.writes, r.key_bytes, r.value_bytes);
                rows.push(vec![
                    size.clone(),
                    r.engine.clone(),
                    r.workload.clone(),
                    r.threads.to_string(),
                    si(r.ops_per_sec),
                    fraction_cell(r.device_reads, r.ops),
                    rate_cell(r.device_reads, r.secs),
                    per_op_cell(r.device_read_bytes, r.ops),
                    per_op_cell(r.device_write_bytes, r.ops),
                    ratio_cell(r.device_write_bytes, written),
                    mib(r.data_allocated_bytes_after_run),
                    ratio_cell(Some(r.data_allocated_bytes_after_run), live),
                    ratio_cell(Some(r.data_bytes_after_run), live),
                ]);
            }
        }
    }
    render(
        &[
            "value B",
            "engine",
            "phase",
            "thr",
            "ops/s",
            "dev reads/op",
            "dev reads/s",
            "dev rd B/op",
            "dev wr B/op",
            "dev wr ÷ user",
            "dir MiB",
            "dir ÷ live",
            "apparent ÷ live",
        ],
        &rows,
    )
}

/// The engine the ratios divide by: `bfdb` if it ran, else the first engine whose name
/// starts with `bfdb` (`bfdb:synced`, `bfdb-tree`).
pub fn reference_engine(runs: &[RunRow]) -> Option<String> {
    let engines = dedup(runs.iter().map(|r| r.engine.clone()));
    engines
        .iter()
        .find(|e| *e == "bfdb")
        .or_else(|| engines.iter().find(|e| e.starts_with("bfdb")))
        .cloned()
}

/// For every workload and thread count, the reference engine's throughput (bfdb's, see
/// [`reference_engine`]) divided by each other engine's: above 1, the reference is
/// faster. Returns the reference's name and the table.
pub fn ratio_table(runs: &[RunRow], loads: &[LoadRow]) -> Option<(String, String)> {
    let reference = reference_engine(runs)?;
    let engines: Vec<String> = dedup(runs.iter().map(|r| r.engine.clone()))
        .into_iter()
        .filter(|e| *e != reference)
        .collect();
    if engines.is_empty() {
        return None;
    }
    let mut rows = Vec::new();
    let reference_load = loads.iter().find(|l| l.engine == reference);
    if let Some(b) = reference_load {
        let mut row = vec!["load".to_string(), String::new()];
        for e in &engines {
            row.push(match loads.iter().find(|l| &l.engine == e) {
                Some(l) if l.ops_per_sec > 0.0 => format!("{:.2}×", b.ops_per_sec / l.ops_per_sec),
                _ => "-".into(),
            });
        }
        rows.push(row);
    }
    for r in runs.iter().filter(|r| r.engine == reference) {
        let mut row = vec![r.workload.clone(), r.threads.to_string()];
        for e in &engines {
            let other = runs
                .iter()
                .find(|o| &o.engine == e && o.workload == r.workload && o.threads == r.threads);
            row.push(match other {
                Some(o) if o.ops_per_sec > 0.0 => format!("{:.2}×", r.ops_per_sec / o.ops_per_sec),
                _ => "-".into(),
            });
        }
        rows.push(row);
    }
    let mut header = vec!["workload".to_string(), "thr".to_string()];
    header.extend(engines.iter().map(|e| format!("{reference} ÷ {e}")));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    Some((reference, render(&header, &rows)))
}

/// The recovery after each engine's run (`--recovery`).
pub fn recovery_table(rows: &[RecoveryRow]) -> String {
    let opt = |x: i64, f: &dyn Fn(u64) -> String| if x < 0 { "-".into() } else { f(x as u64) };
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.engine.clone(),
                format!("{:.3}", r.open_secs),
                if r.engine_secs < 0.0 {
                    "-".into()
                } else {
                    format!("{:.3}", r.engine_secs)
                },
                opt(r.log_bytes, &mib),
                opt(r.records_replayed, &|n| n.to_string()),
                mib(r.read_bytes),
                mib(r.write_bytes),
                mib(r.data_bytes),
                format!("{}/{}", r.found, r.sampled),
                r.mode.clone(),
            ]
        })
        .collect();
    render(
        &[
            "engine",
            "open s",
            "engine's s",
            "log MiB",
            "replayed",
            "rd MiB",
            "wr MiB",
            "data MiB",
            "found",
            "mode",
        ],
        &rows,
    )
}

fn dedup(items: impl Iterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

pub fn write_csv(
    dir: &Path,
    runs: &[RunRow],
    loads: &[LoadRow],
    recoveries: &[RecoveryRow],
) -> std::io::Result<()> {
    let mut out = String::from(
        "engine,mode,durability,cgroup,workload,distribution,threads,ops,secs,ops_per_sec,\
         p50_us,p99_us,p999_us,read_bytes_per_op,write_bytes_per_op,disk_flushes_per_op,\
         cpu_us_per_op,peak_rss_bytes,budget_bytes,data_bytes_after_load,data_bytes_after_run,\
         load_ops_per_sec,not_found,errors,key_bytes,value_bytes,writes,device_read_bytes,\
         device_write_bytes,data_allocated_bytes_after_run,records_after_run,device_reads\n",
    );
    for r in runs {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{:.3},{:.1},{:.2},{:.2},{:.2},{:.1},{:.1},{:.4},{:.2},{},{},{},{},{:.1},{},{},{},{},{},{},{},{},{},{}",
            csv_cell(&r.engine),
            csv_cell(&r.mode),
            r.durability,
            r.cgroup,
            r.workload,
            r.distribution,
            r.threads,
            r.ops,
            r.secs,
            r.ops_per_sec,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.read_bytes_per_op,
            r.write_bytes_per_op,
            r.disk_flushes_per_op,
            r.cpu_us_per_op,
            r.peak_rss_bytes,
            r.budget_bytes,
            r.data_bytes_after_load,
            r.data_bytes_after_run,
            r.load_ops_per_sec,
            r.not_found,
            r.errors,
            r.key_bytes,
            r.value_bytes,
            r.writes,
            opt_field(r.device_read_bytes),
            opt_field(r.device_write_bytes),
            r.data_allocated_bytes_after_run,
            r.records_after_run,
            opt_field(r.device_reads)
        );
    }
    std::fs::write(dir.join("results.csv"), out)?;
    let mut out = String::from(
        "engine,mode,durability,records,secs,ops_per_sec,data_bytes,read_bytes,write_bytes,\
         cpu_us_per_record,peak_rss_bytes,budget_bytes,key_bytes,value_bytes,\
         data_allocated_bytes,device_read_bytes,device_write_bytes,device_reads\n",
    );
    for l in loads {
        let _ = writeln!(
            out,
            "{},{},{},{},{:.3},{:.1},{},{},{},{:.3},{},{},{},{},{},{},{},{}",
            csv_cell(&l.engine),
            csv_cell(&l.mode),
            l.durability,
            l.records,
            l.secs,
            l.ops_per_sec,
            l.data_bytes,
            l.read_bytes,
            l.write_bytes,
            l.cpu_us_per_record,
            l.peak_rss_bytes,
            l.budget_bytes,
            l.key_bytes,
            l.value_bytes,
            l.data_allocated_bytes,
            opt_field(l.device_read_bytes),
            opt_field(l.device_write_bytes),
            opt_field(l.device_reads)
        );
    }
    std::fs::write(dir.join("load.csv"), out)?;
    if recoveries.is_empty() {
        return Ok(());
    }
    let mut out = String::from(
        "engine,mode,durability,open_secs,engine_secs,log_bytes,records_replayed,sampled,found,\
         read_bytes,write_bytes,data_bytes\n",
    );
    for r in recoveries {
        let _ = writeln!(
            out,
            "{},{},{},{:.4},{:.4},{},{},{},{},{},{},{}",
            csv_cell(&r.engine),
            csv_cell(&r.mode),
            r.durability,
            r.open_secs,
            r.engine_secs,
            r.log_bytes,
            r.records_replayed,
            r.sampled,
            r.found,
            r.read_bytes,
            r.write_bytes,
            r.data_bytes
        );
    }
    std::fs::write(dir.join("recovery.csv"), out)
}

/// Registers a DejaVu font for the charts' text if the system has one. plotters' ab_glyph
/// backend loads no system fonts by itself; the font is not shipped with the crate.
pub fn register_font() -> bool {
    let candidates = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/dejavu/DejaVuSansCondensed.ttf",
    ];
    for path in candidates {
        if let Ok(bytes) = std::fs::read(path) {
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font(
                "sans-serif",
                plotters::style::FontStyle::Normal,
                bytes,
            )
            .is_ok()
            {
                return true;
            }
        }
    }
    false
}

const PALETTE: [plotters::style::RGBColor; 7] = [
    plotters::style::RGBColor(0xd6, 0x27, 0x28),
    plotters::style::RGBColor(0x1f, 0x77, 0xb4),
    plotters::style::RGBColor(0x7f, 0x7f, 0x7f),
    plotters::style::RGBColor(0x2c, 0xa0, 0x2c),
    plotters::style::RGBColor(0xff, 0x7f, 0x0e),
    plotters::style::RGBColor(0x94, 0x67, 0xbd),
    plotters::style::RGBColor(0x8c, 0x56, 0x4b),
];

/// How a chart's value axis is drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Axis {
    /// From 0 to `max`.
    Linear { max: f64 },
    /// Logarithmic, from `min` to `max`.
    Log { min: f64, max: f64 },
}

/// When the largest bar of a chart is more than this many times its smallest, a linear
/// axis squeezes the small bars flat (an in-memory `RwLock<BTreeMap>` next to disk
/// engines is ~50× faster), so the chart uses a log axis.
pub const LOG_AXIS_SPREAD: f64 = 10.0;

/// The axis for bars of these (positive) values: linear from 0 when they are within
/// [`LOG_AXIS_SPREAD`] of each other, otherwise logarithmic; with headroom above the
/// largest for the bars' labels. Non-positive and non-finite values are ignored.
pub fn choose_axis(values: &[f64]) -> Axis {
    let positive = values.iter().copied().filter(|v| v.is_finite() && *v > 0.0);
    let (min, max) = positive.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if max == 0.0 {
        return Axis::Linear { max: 1.0 };
    }
    if max / min > LOG_AXIS_SPREAD {
        Axis::Log {
            min: min / 2.0,
            max: max * 3.0,
        }
    } else {
        Axis::Linear { max: max * 1.2 }
    }
}

/// The family a workload's chart belongs to: `load`, `read` (point reads: read, YCSB C),
/// `write` (update, insert), `scan` (scan, YCSB E) or `mix` (mix, YCSB A, B, D, F).
pub fn family(workload: &str) -> &'static str {
    match workload {
        "load" => "load",
        "read" | "c" => "read",
        "update" | "insert" => "write",
        "scan" | "e" => "scan",
        _ => "mix",
    }
}

/// One cluster of bars, one bar per engine.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub label: String,
    /// Engine and value.
    pub bars: Vec<(String, f64)>,
}

/// What one PNG shows.
#[derive(Clone, Debug, PartialEq)]
pub struct ChartSpec {
    /// File name (no directory).
    pub file: String,
    pub caption: String,
    /// What the value axis measures, with its unit.
    pub unit: String,
    pub groups: Vec<Group>,
    /// Bars start here: 0 for throughput, 1 for ratios (a bar above the line is faster).
    pub baseline: f64,
    /// Ratios: bar labels read `1.45×` instead of `85.3K`.
    pub ratio: bool,
}

/// One chart per workload family that has results (load first, then in the order the
/// workloads ran): a cluster per workload and thread count, a bar per engine, throughput
/// in operations (records, for the load) per second.
pub fn family_charts(runs: &[RunRow], loads: &[LoadRow], title: &str) -> Vec<ChartSpec> {
    let mut charts: Vec<ChartSpec> = Vec::new();
    let mut chart_for = |name: &'static str, group: Group| match charts
        .iter_mut()
        .find(|c| c.file == format!("{name}.png"))
    {
        Some(c) => c.groups.push(group),
        None => charts.push(ChartSpec {
            file: format!("{name}.png"),
            caption: format!("{name}: {title}"),
            unit: if name == "load" {
                "records loaded per second".into()
            } else {
                "operations per second".into()
            },
            groups: vec![group],
            baseline: 0.0,
            ratio: false,
        }),
    };
    if !loads.is_empty() {
        chart_for(
            "load",
            Group {
                label: "load".into(),
                bars: loads
                    .iter()
                    .map(|l| (l.engine.clone(), l.ops_per_sec))
                    .collect(),
            },
        );
    }
    for (workload, threads) in workload_threads(runs) {
        let bars = runs
            .iter()
            .filter(|r| r.workload == workload && r.threads == threads)
            .map(|r| (r.engine.clone(), r.ops_per_sec))
            .collect();
        chart_for(
            family(&workload),
            Group {
                label: format!("{workload}, {threads} thr"),
                bars,
            },
        );
    }
    charts
}

/// The (workload, thread count) pairs in the order they ran.
fn workload_threads(runs: &[RunRow]) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for r in runs {
        if !out.iter().any(|(w, t)| *w == r.workload && *t == r.threads) {
            out.push((r.workload.clone(), r.threads));
        }
    }
    out
}

/// The reference engine the relative charts divide by.
pub const REFERENCE: &str = "bftree";

/// One chart per thread count with every engine's throughput divided by bf-tree's in the
/// same cluster (the load, then each workload): bf-tree is the line at 1.0. None when
/// bf-tree did not run.
pub fn relative_charts(runs: &[RunRow], loads: &[LoadRow], title: &str) -> Vec<ChartSpec> {
    if !runs.iter().any(|r| r.engine == REFERENCE) {
        return Vec::new();
    }
    let relative = |bars: Vec<(String, f64)>| -> Vec<(String, f64)> {
        let reference = bars
            .iter()
            .find(|(e, _)| e == REFERENCE)
            .map(|(_, v)| *v)
            .filter(|v| *v > 0.0);
        match reference {
            Some(r) => bars
                .into_iter()
                .filter(|(e, _)| e != REFERENCE)
                .map(|(e, v)| (e, v / r))
                .collect(),
            None => Vec::new(),
        }
    };
    let mut threads: Vec<usize> = runs.iter().map(|r| r.threads).collect();
    threads.sort_unstable();
    threads.dedup();
    threads
        .into_iter()
        .map(|t| {
            let mut groups = Vec::new();
            let load = relative(
                loads
                    .iter()
                    .map(|l| (l.engine.clone(), l.ops_per_sec))
                    .collect(),
            );
            if !load.is_empty() {
                groups.push(Group {
                    label: "load".into(),
                    bars: load,
                });
            }
            for (w, _) in workload_threads(runs)
                .into_iter()
                .filter(|(_, wt)| *wt == t)
            {
                let bars = relative(
                    runs.iter()
                        .filter(|r| r.workload == w && r.threads == t)
                        .map(|r| (r.engine.clone(), r.ops_per_sec))
                        .collect(),
                );
                if !bars.is_empty() {
                    groups.push(Group { label: w, bars });
                }
            }
            ChartSpec {
                file: format!("vs-bftree-{t}threads.png"),
                caption: format!("throughput relative to bf-tree, {t} threads: {title}"),
                unit: "throughput ÷ bf-tree's (bf-tree = 1.0; above: faster)".into(),
                groups,
                baseline: 1.0,
                ratio: true,
            }
        })
        .filter(|c| !c.groups.is_empty())
        .collect()
}

/// Draws one PNG per workload family (its own axis) and one per thread count relative
/// to bf-tree. Returns the files written.
pub fn draw_charts(
    dir: &Path,
    runs: &[RunRow],
    loads: &[LoadRow],
    title: &str,
    with_text: bool,
) -> Result<Vec<std::path::PathBuf>, String> {
    use plotters::prelude::*;
    // Colours follow the engine's place in the run, the same in every chart.
    let engines = dedup(
        loads
            .iter()
            .map(|l| l.engine.clone())
            .chain(runs.iter().map(|r| r.engine.clone())),
    );
    let mut files = Vec::new();
    for spec in family_charts(runs, loads, title)
        .into_iter()
        .chain(relative_charts(runs, loads, title))
    {
        let path = dir.join(&spec.file);
        let mut values: Vec<f64> = spec
            .groups
            .iter()
            .flat_map(|g| g.bars.iter().map(|b| b.1))
            .collect();
        if spec.ratio {
            values.push(1.0);
        }
        let axis = if spec.ratio {
            // Ratios always on a log axis: 2× faster and 2× slower are the same length.
            match choose_axis(&values) {
                Axis::Log { min, max } => Axis::Log { min, max },
                Axis::Linear { .. } => {
                    let (lo, hi) = values.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
                        (lo.min(*v), hi.max(*v))
                    });
                    Axis::Log {
                        min: lo / 1.5,
                        max: hi * 1.6,
                    }
                }
            }
        } else {
            choose_axis(&values)
        };
        match axis {
            Axis::Linear { max } => {
                draw_bars(&path, &spec, &engines, 0f64..max, "linear", with_text)?
            }
            Axis::Log { min, max } => draw_bars(
                &path,
                &spec,
                &engines,
                (min..max).log_scale(),
                "log scale",
                with_text,
            )?,
        }
        files.push(path);
    }
    Ok(files)
}

fn draw_bars<Y>(
    path: &Path,
    spec: &ChartSpec,
    engines: &[String],
    y_range: Y,
    scale: &str,
    with_text: bool,
) -> Result<(), String>
where
    Y: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
    Y::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
{
    use plotters::prelude::*;
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();
    let root = BitMapBackend::new(path, (1100, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(15);
    if with_text {
        builder
            .caption(&spec.caption, ("sans-serif", 18))
            .x_label_area_size(35)
            .y_label_area_size(80);
    }
    let groups = spec.groups.len().max(1) as f64;
    let mut chart = builder
        .build_cartesian_2d(0f64..groups, y_range)
        .map_err(err)?;
    let (y_lo, y_hi) = {
        let r = chart.y_range();
        (r.start, r.end)
    };
    if with_text {
        let ratio = spec.ratio;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc(format!("{} ({scale})", spec.unit))
            .y_label_formatter(&|y| {
                if ratio { format!("{y:.2}×") } else { si(*y) }
            })
            .draw()
            .map_err(err)?;
    }
    let baseline = spec.baseline.clamp(y_lo, y_hi);
    if spec.ratio {
        chart
            .draw_series(LineSeries::new(
                [(0.0, 1.0), (groups, 1.0)],
                BLACK.stroke_width(2),
            ))
            .map_err(err)?
            .label("bf-tree = 1.0")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], BLACK.stroke_width(2)));
    }
    let per_group = spec.groups.iter().map(|g| g.bars.len()).max().unwrap_or(1);
    let slot = 1.0 / (per_group as f64 + 1.0);
    for (ei, engine) in engines.iter().enumerate() {
        let color = PALETTE[ei % PALETTE.len()];
        let bars: Vec<(f64, f64)> = spec
            .groups
            .iter()
            .enumerate()
            .filter_map(|(gi, g)| {
                let bi = g.bars.iter().position(|(e, _)| e == engine)?;
                let x0 = gi as f64 + slot * (bi as f64 + 0.5);
                Some((x0, g.bars[bi].1))
            })
            .collect();
        if bars.is_empty() {
            continue;
        }
        let series = chart
            .draw_series(bars.iter().map(|&(x0, y)| {
                Rectangle::new(
                    [(x0, baseline), (x0 + slot * 0.9, y.clamp(y_lo, y_hi))],
                    color.filled(),
                )
            }))
            .map_err(err)?;
        if with_text {
            series.label(engine.as_str()).legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
            });
            for &(x0, y) in &bars {
                let text = if spec.ratio {
                    format!("{y:.2}×")
                } else {
                    si(y)
                };
                let (px, py) = chart.backend_coord(&(x0, y.clamp(y_lo, y_hi)));
                // Above a bar that rises from the baseline, below one that falls.
                let dy = if y >= spec.baseline { -16 } else { 4 };
                root.draw(&Text::new(text, (px, py + dy), ("sans-serif", 11)))
                    .map_err(err)?;
            }
        }
    }
    if with_text {
        for (gi, g) in spec.groups.iter().enumerate() {
            let (px, _) = chart.backend_coord(&(gi as f64 + 0.5, y_lo));
            let (_, py) = chart.backend_coord(&(0.0, y_lo));
            let half = 4 * g.label.chars().count() as i32;
            root.draw(&Text::new(
                g.label.clone(),
                (px - half, py + 8),
                ("sans-serif", 14),
            ))
            .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.9))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let run = RunRow {
            engine: "bfdb".into(),
            mode: "file, StdDirect (O_DIRECT)".into(),
            workload: "mix".into(),
            threads: 16,
            ops_per_sec: 1234.5,
            p999_us: 17.25,
            cpu_us_per_op: 9.75,
            errors: 3,
            writes: 40,
            device_write_bytes: Some(1 << 33),
            data_allocated_bytes_after_run: 12_288,
            value_bytes: 65_536,
            ..RunRow::default()
        };
        let Some(Line::Run(back)) = parse_line(&run.to_line()) else {
            panic!("not parsed");
        };
        assert_eq!(back.mode, run.mode);
        assert_eq!(back.threads, 16);
        assert_eq!(back.ops_per_sec, 1234.5);
        assert_eq!(back.p999_us, 17.25);
        assert_eq!(back.cpu_us_per_op, 9.75);
        assert_eq!(back.errors, 3);
        assert_eq!(back.writes, 40);
        assert_eq!(back.device_write_bytes, Some(1 << 33));
        // Unknown device counts stay unknown, not zero.
        assert_eq!(back.device_read_bytes, None);
        assert_eq!(back.data_allocated_bytes_after_run, 12_288);
        assert_eq!(back.value_bytes, 65_536);
        let load = LoadRow {
            engine: "bftree".into(),
            records: 99,
            cpu_us_per_record: 2.5,
            ..LoadRow::default()
        };
        let Some(Line::Load(back)) = parse_line(&load.to_line()) else {
            panic!("not parsed");
        };
        assert_eq!(back.records, 99);
        assert_eq!(back.cpu_us_per_record, 2.5);
        assert!(parse_line("progress: 10%").is_none());
        let recovery = RecoveryRow {
            engine: "bfdb:synced".into(),
            durability: "synced".into(),
            open_secs: 0.25,
            engine_secs: -1.0,
            log_bytes: 4096,
            records_replayed: 7,
            sampled: 1000,
            found: 1000,
            ..RecoveryRow::default()
        };
        let Some(Line::Recovery(back)) = parse_line(&recovery.to_line()) else {
            panic!("not parsed");
        };
        assert_eq!(back.engine, "bfdb:synced");
        assert_eq!(back.open_secs, 0.25);
        assert_eq!(back.engine_secs, -1.0);
        assert_eq!((back.log_bytes, back.records_replayed), (4096, 7));
        assert_eq!((back.found, back.sampled), (1000, 1000));
    }

    fn run(engine: &str, workload: &str, threads: usize, ops_per_sec: f64) -> RunRow {
        RunRow {
            engine: engine.into(),
            workload: workload.into(),
            threads,
            ops_per_sec,
            ..RunRow::default()
        }
    }

    #[test]
    fn axis_is_linear_for_close_values_and_log_for_spread_ones() {
        assert_eq!(choose_axis(&[100.0, 50.0]), Axis::Linear { max: 120.0 });
        // bf-tree on disk next to RwLock<BTreeMap> in memory: 50 times apart.
        assert_eq!(
            choose_axis(&[10_000.0, 500_000.0, 0.0]),
            Axis::Log {
                min: 5_000.0,
                max: 1_500_000.0
            }
        );
        assert_eq!(
            choose_axis(&[10.0, 10.0 * LOG_AXIS_SPREAD]),
            Axis::Linear {
                max: 10.0 * LOG_AXIS_SPREAD * 1.2
            }
        );
        assert_eq!(choose_axis(&[]), Axis::Linear { max: 1.0 });
        assert_eq!(choose_axis(&[0.0, f64::NAN]), Axis::Linear { max: 1.0 });
    }

    #[test]
    fn workloads_fall_into_families() {
        let families: Vec<&str> = ["load", "read", "c", "update", "insert", "scan", "e", "mix"]
            .iter()
            .map(|w| family(w))
            .collect();
        assert_eq!(
            families,
            [
                "load", "read", "read", "write", "write", "scan", "scan", "mix"
            ]
        );
        for w in ["a", "b", "d", "f"] {
            assert_eq!(family(w), "mix");
        }
    }

    #[test]
    fn family_charts_group_workloads_and_threads() {
        let runs = [
            run("bfdb", "read", 2, 10.0),
            run("bfdb", "c", 2, 11.0),
            run("bfdb", "update", 2, 20.0),
            run("bfdb", "read", 16, 30.0),
            run("bftree", "read", 2, 5.0),
            run("bftree", "update", 2, 6.0),
        ];
        let loads = [LoadRow {
            engine: "bfdb".into(),
            ops_per_sec: 7.0,
            ..LoadRow::default()
        }];
        let charts = family_charts(&runs, &loads, "t");
        let files: Vec<&str> = charts.iter().map(|c| c.file.as_str()).collect();
        assert_eq!(files, ["load.png", "read.png", "write.png"]);
        let read = &charts[1];
        assert!(read.unit.contains("per second"));
        let labels: Vec<&str> = read.groups.iter().map(|g| g.label.as_str()).collect();
        assert_eq!(labels, ["read, 2 thr", "c, 2 thr", "read, 16 thr"]);
        assert_eq!(
            read.groups[0].bars,
            [("bfdb".to_string(), 10.0), ("bftree".to_string(), 5.0)]
        );
        assert_eq!(charts[0].groups[0].bars, [("bfdb".to_string(), 7.0)]);
    }

    #[test]
    fn relative_charts_divide_by_bftree_per_thread_count() {
        let runs = [
            run("bfdb", "read", 2, 30.0),
            run("bftree", "read", 2, 10.0),
            run("btreemap", "read", 2, 500.0),
            run("bfdb", "read", 16, 40.0),
            run("bfdb", "scan", 16, 40.0),
            run("bftree", "scan", 16, 80.0),
        ];
        let charts = relative_charts(&runs, &[], "t");
        assert_eq!(charts.len(), 2);
        assert_eq!(charts[0].file, "vs-bftree-2threads.png");
        assert_eq!(
            charts[0].groups[0].bars,
            [("bfdb".to_string(), 3.0), ("btreemap".to_string(), 50.0)]
        );
        // At 16 threads bf-tree has no read result: only the scan cluster is drawn.
        assert_eq!(charts[1].groups.len(), 1);
        assert_eq!(charts[1].groups[0].label, "scan");
        assert_eq!(charts[1].groups[0].bars, [("bfdb".to_string(), 0.5)]);
        assert!(relative_charts(&runs[..1], &[], "t").is_empty());
    }

    #[test]
    fn amplification_divides_device_writes_by_user_writes_and_space_by_live_data() {
        let load = LoadRow {
            engine: "bfdb".into(),
            records: 1000,
            key_bytes: 16,
            value_bytes: 8192,
            ops_per_sec: 5000.0,
            secs: 0.2,
            // 1000 records of 8,208 bytes: 8,208,000 bytes of user data.
            device_reads: Some(500),
            device_read_bytes: Some(0),
            device_write_bytes: Some(16_416_000),
            data_bytes: 12_312_000,
            data_allocated_bytes: 8_208_000,
            ..LoadRow::default()
        };
        let a = RunRow {
            engine: "bfdb".into(),
            workload: "a".into(),
            threads: 2,
            ops: 200,
            writes: 100,
            key_bytes: 16,
            value_bytes: 8192,
            records_after_run: 1000,
            secs: 0.1,
            device_reads: Some(50),
            device_read_bytes: Some(820_800),
            device_write_bytes: Some(2_462_400),
            data_bytes_after_run: 8_208_000,
            data_allocated_bytes_after_run: 16_416_000,
            ..RunRow::default()
        };
        let c = RunRow {
            workload: "c".into(),
            writes: 0,
            device_reads: None,
            device_write_bytes: None,
            ..a.clone()
        };
        let table = amplification_table(&[a, c], &[load]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 5, "{table}");
        let cells = |i: usize| lines[i].split_whitespace().collect::<Vec<_>>();
        // value, engine, phase, (threads), ops/s, dev reads/op, dev reads/s, dev rd/op,
        // dev wr/op, wr ÷ user, dir MiB, dir ÷ live, apparent ÷ live.
        assert_eq!(
            cells(2),
            [
                "8192", "bfdb", "load", "5.0K", "0.500", "2.5K", "0", "16416", "2.00", "7.8",
                "1.00", "1.50"
            ]
        );
        assert_eq!(
            cells(3),
            [
                "8192", "bfdb", "a", "2", "0", "0.250", "500", "4104", "12312", "3.00", "15.7",
                "2.00", "1.00"
            ]
        );
        // No writes: no ratio; no device counters: dashes.
        assert_eq!(cells(4)[5..7], ["-", "-"]);
        assert_eq!(cells(4)[8..10], ["-", "-"]);
    }

    #[test]
    fn ratios_divide_bfdb_by_each_engine() {
        let row = |e: &str, t: f64| RunRow {
            engine: e.into(),
            workload: "read".into(),
            threads: 2,
            ops_per_sec: t,
            ..RunRow::default()
        };
        let (reference, table) =
            ratio_table(&[row("bfdb", 300.0), row("bftree", 100.0)], &[]).unwrap();
        assert_eq!(reference, "bfdb");
        assert!(table.contains("3.00×"), "{table}");
        assert!(ratio_table(&[row("bftree", 1.0)], &[]).is_none());
        // Without a plain bfdb, the first bfdb-like engine is the reference.
        let (reference, table) = ratio_table(
            &[
                row("rocksdb:synced", 100.0),
                row("bfdb:synced", 250.0),
                row("bfdb-tree", 50.0),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(reference, "bfdb:synced");
        assert!(table.contains("bfdb:synced ÷ rocksdb:synced"), "{table}");
        assert!(
            table.contains("2.50×") && table.contains("5.00×"),
            "{table}"
        );
    }
}
