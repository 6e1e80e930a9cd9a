//! A model of the hash store's memory as a cache (issue 35, item 5): the miss rate of its
//! reads under the YCSB driver's Zipf keys, for a memory split and a policy, beside an
//! ideal cache of the same memory. It chose the read cache's share and the second chance
//! for hot-log records (docs/design.md, the hash store's "Memory" and "F2's read cache");
//! the store's own rates come from `HashStoreStats` in a real run.
//!
//! Run: `cargo run --release --example cache_sim -- [options]`
//!
//! ```text
//! --keys N            keys (default 20000000)
//! --memory-mib N      the store's memory (default 206)
//! --updates PCT       share of operations that write (default 50: YCSB-A; 5: B)
//! --read-cache F      the read cache's share of the memory (default 0.3333)
//! --hot-index F       the hot index's share (default 0.1667)
//! --admission on|off  copy a record read from disk only on its second read (default on)
//! --keep on|off       hot-log records read in memory get a copy as they leave it (default on)
//! --ops N             operations to warm up, then as many measured (default 20000000)
//! --theta T           Zipf constant (default 0.99)
//! --small             CI mode: 200,000 keys, 2 MiB, 400,000 operations
//! ```
//!
//! The model, for the benchmark's records of an 8-byte key and a 100-byte value (128
//! bytes in a log):
//! the hot log's frames hold the newest distinct records written (an update of a record
//! in the mutable 90% is in place, any other appends); the read cache is a FIFO of copies
//! whose copies read again in its older half move to its tail; a write invalidates its
//! key's copy; a read missing both is one device read, copied into the read cache on its
//! second read while a doorkeeper of `read cache / 32` two-byte slots remembers the first
//! (`--admission`); with `--keep`, a record read while in the hot log's frames gets a copy
//! when it leaves them if it is still its key's newest. Pages, chains and the hot log's
//! part on disk are not modelled: a read not answered from memory is one miss.

#[path = "ycsb/keygen.rs"]
#[allow(dead_code)]
mod keygen;

use keygen::{Rng, Zipf};

/// A slot that names nothing.
const NONE: u64 = u64::MAX;

struct Options {
    keys: u64,
    memory_mib: u64,
    updates: u64,
    read_cache: f64,
    hot_index: f64,
    admission: bool,
    keep: bool,
    ops: u64,
    theta: f64,
}

/// A record of an 8-byte key and a 100-byte value in a hash log: a 16-byte header, the
/// key, the value with its checksum, each padded to 8 bytes.
const RECORD_BYTES: u64 = 16 + 8 + 104;
/// What an ideal cache spends on one: the key, the value, a 16-byte header and an 8-byte
/// index entry (as the YCSB driver's ideal cache counts).
const IDEAL_RECORD_BYTES: u64 = 8 + 100 + 24;

fn parse() -> Result<Options, String> {
    let mut o = Options {
        keys: 20_000_000,
        memory_mib: 206,
        updates: 50,
        read_cache: 1.0 / 3.0,
        hot_index: 1.0 / 6.0,
        admission: true,
        keep: true,
        ops: 20_000_000,
        theta: 0.99,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].as_str();
        if flag == "--small" {
            (o.keys, o.memory_mib, o.ops) = (200_000, 2, 400_000);
            i += 1;
            continue;
        }
        let value = args.get(i + 1).ok_or(format!("{flag} needs a value"))?;
        let bad = |_| format!("{flag}: cannot read {value:?}");
        let bad_f = |_| format!("{flag}: cannot read {value:?}");
        let on = || match value.as_str() {
            "on" => Ok(true),
            "off" => Ok(false),
            _ => Err(format!("{flag}: on or off, not {value:?}")),
        };
        match flag {
            "--keys" => o.keys = value.parse().map_err(bad)?,
            "--memory-mib" => o.memory_mib = value.parse().map_err(bad)?,
            "--updates" => o.updates = value.parse().map_err(bad)?,
            "--read-cache" => o.read_cache = value.parse().map_err(bad_f)?,
            "--hot-index" => o.hot_index = value.parse().map_err(bad_f)?,
            "--admission" => o.admission = on()?,
            "--keep" => o.keep = on()?,
            "--ops" => o.ops = value.parse().map_err(bad)?,
            "--theta" => o.theta = value.parse().map_err(bad_f)?,
            _ => return Err(format!("unknown option {flag}")),
        }
        i += 2;
    }
    if o.keys == 0 || o.updates > 100 || o.read_cache + o.hot_index >= 1.0 {
        return Err("keys > 0, --updates up to 100, read cache + hot index below 1".into());
    }
    Ok(o)
}

/// The caches' state.
struct Model {
    /// Records the hot log's frames hold, of which the newest `mutable` in place.
    hot_records: u64,
    mutable: u64,
    /// Copies the read cache holds.
    cached_records: u64,
    /// Per key: the sequence number of its newest hot-log record and of its copy.
    hot_at: Vec<u64>,
    copy_at: Vec<u64>,
    /// Per key: read while its newest record was in the frames.
    read_in_memory: Vec<bool>,
    /// The key of each of the last `hot_records` appends, by sequence number.
    appended: Vec<u32>,
    hot_tail: u64,
    cache_tail: u64,
    doorkeeper: Vec<u16>,
    keep: bool,
    reads: u64,
    misses: u64,
    kept: u64,
}

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Model {
    fn in_frames(&self, key: usize) -> bool {
        let at = self.hot_at[key];
        at != NONE && at + self.hot_records > self.hot_tail
    }

    fn cached(&self, key: usize) -> bool {
        let at = self.copy_at[key];
        at != NONE && at + self.cached_records > self.cache_tail
    }

    fn copy(&mut self, key: usize) {
        if self.cached_records > 0 {
            self.copy_at[key] = self.cache_tail;
            self.cache_tail += 1;
        }
    }

    /// The doorkeeper: whether `key` was read from disk lately (and it remembers it now).
    fn admit(&mut self, key: u64) -> bool {
        if self.doorkeeper.is_empty() {
            return true;
        }
        let h = mix(key);
        let slots = self.doorkeeper.len();
        let slot = &mut self.doorkeeper[((h >> 16) as usize) & (slots - 1)];
        let fingerprint = ((h >> 40) as u16) | 1;
        let seen = *slot == fingerprint;
        *slot = fingerprint;
        seen
    }

    fn read(&mut self, key: u64) {
        let k = key as usize;
        self.reads += 1;
        if self.in_frames(k) {
            self.read_in_memory[k] = true;
            return;
        }
        if self.cached(k) {
            if self.copy_at[k] + self.cached_records / 2 < self.cache_tail {
                self.copy(k);
            }
            return;
        }
        self.misses += 1;
        if self.admit(key) {
            self.copy(k);
        }
    }

    fn update(&mut self, key: u64) {
        let k = key as usize;
        self.copy_at[k] = NONE;
        let at = self.hot_at[k];
        if at != NONE && at + self.mutable > self.hot_tail {
            return;
        }
        if self.hot_records > 0 {
            let slot = (self.hot_tail % self.hot_records) as usize;
            let leaving = self.appended[slot] as usize;
            if self.keep
                && self.hot_tail >= self.hot_records
                && self.hot_at[leaving] == self.hot_tail - self.hot_records
                && self.read_in_memory[leaving]
                && !self.cached(leaving)
            {
                self.copy(leaving);
                self.kept += 1;
            }
            self.appended[slot] = key as u32;
        }
        self.read_in_memory[k] = false;
        self.hot_at[k] = self.hot_tail;
        self.hot_tail += 1;
    }
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cache_sim: {e}");
            std::process::exit(2);
        }
    };
    let memory = o.memory_mib << 20;
    let index = (memory as f64 * o.hot_index) as u64;
    let cache_bytes = (memory as f64 * o.read_cache) as u64;
    let doorkeeper_bytes = if o.admission && cache_bytes > 0 {
        2 * (cache_bytes / 32).max(2).next_power_of_two() / 2
    } else {
        0
    };
    let hot_bytes = memory - index - cache_bytes;
    // The read bits of the hot log's frames come out of its share when they are kept.
    let hot_bytes = if o.keep {
        hot_bytes / 65 * 64
    } else {
        hot_bytes
    };
    let hot_records = hot_bytes / RECORD_BYTES;
    let mut model = Model {
        hot_records,
        mutable: hot_records * 9 / 10,
        cached_records: cache_bytes.saturating_sub(doorkeeper_bytes) / RECORD_BYTES,
        hot_at: vec![NONE; o.keys as usize],
        copy_at: vec![NONE; o.keys as usize],
        read_in_memory: vec![false; o.keys as usize],
        appended: vec![0; hot_records as usize],
        hot_tail: 0,
        cache_tail: 0,
        doorkeeper: vec![0; (doorkeeper_bytes / 2) as usize],
        keep: o.keep,
        reads: 0,
        misses: 0,
        kept: 0,
    };
    let zipf = Zipf::new(o.keys, o.theta).unwrap_or_else(|e| {
        eprintln!("cache_sim: {e}");
        std::process::exit(2)
    });
    let mut rng = Rng::new(7);
    for measured in [false, true] {
        if measured {
            (model.reads, model.misses, model.kept) = (0, 0, 0);
        }
        for _ in 0..o.ops {
            // Ranks spread over the keys, as the driver's scramble spreads them.
            let key = mix(zipf.sample(&mut rng)) % o.keys;
            if rng.next_u64() % 100 < o.updates {
                model.update(key);
            } else {
                model.read(key);
            }
        }
    }
    let ideal_records = (memory / IDEAL_RECORD_BYTES).min(o.keys);
    let ideal_miss = 1.0 - keygen::zeta(ideal_records, o.theta) / keygen::zeta(o.keys, o.theta);
    println!(
        "{} keys, {} MiB, {}% updates, read cache {:.3}, hot index {:.3}, admission {}, \
         keep {}: hot log {} records, read cache {} copies; {} reads, {:.2}% missed \
         ({} kept); an ideal cache of {} records: {:.2}% missed",
        o.keys,
        o.memory_mib,
        o.updates,
        o.read_cache,
        o.hot_index,
        if o.admission { "on" } else { "off" },
        if o.keep { "on" } else { "off" },
        model.hot_records,
        model.cached_records,
        model.reads,
        100.0 * model.misses as f64 / model.reads.max(1) as f64,
        model.kept,
        ideal_records,
        100.0 * ideal_miss
    );
}
