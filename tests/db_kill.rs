//! The database against real crashes: a child process writes to two tree keyspaces and
//! a hash keyspace at [`Durability::Synced`] and the parent kills it with SIGKILL at a
//! random moment, reopens the database (recovery replays the write-ahead log) and checks
//! what came back against what the child reported. It does this many times on one
//! directory, so every child recovers what the earlier ones left, and kills land in
//! recovery, in segment creation, in group commits, in the hash keyspace's compactions
//! and between a write and its report.
//!
//! **The child** is this test binary run again on the ignored test `child_process_entry`,
//! which does nothing unless `BFDB_KILL_CHILD_DIR` names a directory. It opens the
//! database there (a 1 MiB pool per keyspace, so leaf pages are evicted and read back;
//! 128 KiB log segments, so segments are created often), opens two tree keyspaces and a
//! hash keyspace (256 KiB of memory, 256 KiB of hot log and 1 MiB of cold log on disk,
//! and values of at most 600 bytes but one in ten of up to 300 KB kept out of line, so
//! the hot log flushes and is compacted into the cold log, and the cold log into itself,
//! while the children write), and writes from 2
//! to 4 threads until it is killed: single puts and deletes in any keyspace,
//! read-modify-writes of the hash keyspace, and batches that put one value into one key
//! of each of two keyspaces (both trees, or a tree and the hash keyspace). Keys are
//! shared by the threads; a hot set of 32 keys per keyspace takes half the writes, so
//! writers race on keys and overwrite and delete what earlier children wrote. Every
//! value names its write (`r<run>.t<thread>.c<counter>:` and then letters drawn from
//! that name), so the parent can tell which write any value it finds came from, and
//! rebuild it byte for byte. A read-modify-write stores such a value too, whatever it
//! reads (so the parent checks it as a put of its result), and the child checks that
//! what it read is a value some write stored. On stdout the child reports each write
//! before issuing it (`try <write> <what>`) and after it returned (`ack <write>`), one
//! whole line per `write(2)`, under a mutex; and every 50 ms what the hash keyspace's
//! compactions have done (`hash <counts>`).
//!
//! **The parent** reads those lines; the order in which they arrive is an order of real
//! time. A write whose `ack` line comes before the `try` line of another write of the
//! same key was durable before that one began, so it is earlier in the log. After the
//! kill it reopens the database and checks, for every key any write ever named:
//!
//! - nothing acknowledged is lost: the key holds the value (or absence) of a write that
//!   no acknowledged write of the key definitely follows — the last acknowledged one or
//!   one that may have come after it, acknowledged or not — and what the previous
//!   recovery found only if this child acknowledged no write of the key;
//! - no garbage: a value found is byte for byte the value of a write of that key, and a
//!   scan yields no key that no write named;
//! - batches are all or nothing: a key without a batch's value beside a key with it
//!   must hold a write that may have come after the batch;
//! - a full scan of each tree keyspace yields exactly what point reads found (a hash
//!   keyspace has no scan: point reads of every key any write named check it).
//!
//! What a recovery found becomes the starting point of the next run's checks.
//!
//! A second run, on a database of 16 KiB leaf pages and a key limit of 4 KiB, gives a
//! third of its writes long keys (issue #34): slots of their own whose keys are up to
//! 4 KiB long, most sharing prefixes of 1000 to 3900 bytes (so the trees' fences and
//! separators are that long), in every keyspace, batches mixing them with short ones.
//!
//! `cargo test --test db_kill` kills 12 children, and 8 in the run of long keys (CI runs
//! this); `BFDB_KILLS` sets the number of both. The long run, 200 kills:
//!
//! ```text
//! BFDB_KILLS=200 cargo test --release --test db_kill -- --nocapture
//! ```
//!
//! Children and the parent take checkpoints (in the background as the log grows, and
//! when the parent closes the database after its checks), so a recovery replays only
//! the log after the last one.
//!
//! The parent prints its seed; `BFDB_SEED=<seed>` replays its choices (the kill moments
//! and the children's seeds), though not the threads' interleaving. A failing run keeps
//! the database directory and the child's report lines, and prints where they are.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write as _};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bfdb::{Config, Db, DbOptions, Durability, HashStore, HashStoreOptions, Tree, WriteBatch};

mod common;
use common::{Rng, env_u64, mix};

/// The environment of the child: the database directory (its presence makes
/// `child_process_entry` the child), the run number, and the seed of its writers.
const CHILD_DIR: &str = "BFDB_KILL_CHILD_DIR";
const CHILD_RUN: &str = "BFDB_KILL_CHILD_RUN";
const CHILD_SEED: &str = "BFDB_KILL_CHILD_SEED";
/// Set (to 1) for the child of the run of long keys.
const CHILD_LONG_KEYS: &str = "BFDB_KILL_CHILD_LONG_KEYS";

/// Starts the child's report lines; the test harness prints lines of its own.
const MARK: &str = "@@bfdb-kill ";

/// The keyspaces the child writes: the trees, then the hash keyspace.
const KEYSPACES: [&str; 3] = ["alpha", "beta", "gamma"];

/// The index of the hash keyspace in [`KEYSPACES`]; the ones before it are trees.
const HASH: usize = 2;

/// Keys per keyspace, and the hot ones among them that take half the writes.
const SLOTS: u64 = 2048;
const HOT_SLOTS: u64 = 32;

/// Kills when `BFDB_KILLS` is not set, in the first run and in the run of long keys.
const DEFAULT_KILLS: u64 = 12;
const DEFAULT_LONG_KEY_KILLS: u64 = 8;

/// The slots of long keys: `LONG_SLOTS` of them from `LONG_SLOTS_FROM` on (the hot ones
/// first), which only the run of long keys writes.
const LONG_SLOTS_FROM: u64 = 1 << 20;
const LONG_SLOTS: u64 = 512;

/// How long the parent waits for a child to open the database before it calls the
/// child hung (a guard against hanging the test, not a check of speed).
const HANG_GUARD: Duration = Duration::from_secs(300);

/// The options of both processes; with `long_keys`, 16 KiB leaf pages and keys up to
/// 4 KiB.
fn options(long_keys: bool) -> DbOptions {
    let config = Config {
        memory_budget_bytes: 1 << 20,
        huge_pages: false,
        ..Config::default()
    };
    let config = match long_keys {
        false => config,
        true => Config {
            max_key_bytes: common::LONG_KEY_MAX_BYTES,
            leaf_page_size_bytes: common::LONG_KEY_LEAF_PAGE_BYTES,
            ..config
        },
    };
    DbOptions::default()
        .config(config)
        .log_segment_bytes(128 << 10)
        // Checkpoints often, so that kills land in them too.
        .checkpoint_log_bytes(512 << 10)
        .checkpoint_interval(Some(std::time::Duration::from_millis(150)))
}

/// The hash keyspace's options: a few hundred KiB of memory and about a MiB of disk, so
/// that its hot log flushes and both compactions run while the children write (with
/// `long_keys`, 4 MiB of cold log: its keys take a MiB more, in the cold log layout;
/// short keys keep theirs in cold runs, the default).
fn hash_options(long_keys: bool) -> HashStoreOptions {
    HashStoreOptions::default()
        .memory_bytes(256 << 10)
        .expected_keys(4 * SLOTS)
        .hot_log_disk_bytes(256 << 10)
        .cold_log_disk_bytes(if long_keys { 4 << 20 } else { 1 << 20 })
        .cold_layout(if long_keys {
            bfdb::ColdLayout::Log
        } else {
            bfdb::ColdLayout::Runs
        })
}

// ---------------------------------------------------------------------------------------
// Writes, keys and values
// ---------------------------------------------------------------------------------------

/// A write of a child: its run (the kill round), thread, and the thread's counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct WriteId {
    run: u64,
    thread: u64,
    counter: u64,
}

impl fmt::Display for WriteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}.t{}.c{}", self.run, self.thread, self.counter)
    }
}

impl WriteId {
    fn parse(s: &str) -> Option<WriteId> {
        let (run, rest) = s.strip_prefix('r')?.split_once(".t")?;
        let (thread, counter) = rest.split_once(".c")?;
        Some(WriteId {
            run: run.parse().ok()?,
            thread: thread.parse().ok()?,
            counter: counter.parse().ok()?,
        })
    }
}

/// A key: the index of its keyspace in [`KEYSPACES`], and its bytes.
type Key = (usize, Vec<u8>);

/// What a recovery left under each key: its value, or `None` if absent.
type Found = BTreeMap<Key, Option<Vec<u8>>>;

/// The key of `slot`: `key` and five digits, or from `LONG_SLOTS_FROM` on a long key
/// (`common::long_named_key`) that holds its name `key` and seven digits.
fn key_of(slot: u64) -> Vec<u8> {
    if slot < LONG_SLOTS_FROM {
        format!("key{slot:05}").into_bytes()
    } else {
        common::long_named_key(format!("key{slot:07}").as_bytes(), mix(slot))
    }
}

fn show_key(key: &Key) -> String {
    let bytes = &key.1;
    if bytes.len() <= 16 {
        return format!("{}/{}", KEYSPACES[key.0], String::from_utf8_lossy(bytes));
    }
    // A long key: its name, after the prefix of its family.
    let at = bytes.windows(3).position(|w| w == b"key").unwrap_or(0);
    let name = String::from_utf8_lossy(&bytes[at..(at + 10).min(bytes.len())]);
    format!(
        "{}/{name} (a {}-byte key, its name at {at})",
        KEYSPACES[key.0],
        bytes.len()
    )
}

/// The value write `id` stores, `len` bytes long (or its header, if longer):
/// `"<id>:"`, then letters drawn from the id.
fn value_of(id: WriteId, len: usize) -> Vec<u8> {
    let mut value = format!("{id}:").into_bytes();
    let mut h = mix(id.run ^ mix(id.thread ^ mix(id.counter)));
    while value.len() < len {
        h = mix(h);
        value.push(b'a' + (h % 26) as u8);
    }
    value
}

/// The write a value names in its header, if it has one.
fn writer_of(value: &[u8]) -> Option<WriteId> {
    let header = value.split(|&b| b == b':').next()?;
    WriteId::parse(std::str::from_utf8(header).ok()?)
}

/// A value or an absence, short, for messages.
fn show_value(value: Option<&[u8]>) -> String {
    match value {
        None => "absent".into(),
        Some(v) => {
            let head = String::from_utf8_lossy(&v[..v.len().min(24)]);
            format!("{head:?}… ({} bytes)", v.len())
        }
    }
}

/// What a write does.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Write {
    /// Puts a value of `len` bytes under `slot` of keyspace `ks`.
    Put { ks: usize, slot: u64, len: usize },
    /// Deletes `slot` of keyspace `ks`.
    Delete { ks: usize, slot: u64 },
    /// Replaces the value under `slot` of the hash keyspace with one of `len` bytes by a
    /// read-modify-write (which stores its write's value whatever it reads).
    Rmw { slot: u64, len: usize },
    /// Puts one value of `len` bytes under `slots[0]` of keyspace `ks[0]` and
    /// `slots[1]` of keyspace `ks[1]` (another one), as one batch.
    Batch {
        ks: [usize; 2],
        slots: [u64; 2],
        len: usize,
    },
}

impl Write {
    /// The keys it writes.
    fn keys(&self) -> Vec<Key> {
        match *self {
            Write::Put { ks, slot, .. } | Write::Delete { ks, slot } => vec![(ks, key_of(slot))],
            Write::Rmw { slot, .. } => vec![(HASH, key_of(slot))],
            Write::Batch { ks, slots, .. } => {
                vec![(ks[0], key_of(slots[0])), (ks[1], key_of(slots[1]))]
            }
        }
    }

    /// The length of the value it stores; `None` for a delete.
    fn value_len(&self) -> Option<usize> {
        match *self {
            Write::Put { len, .. } | Write::Rmw { len, .. } | Write::Batch { len, .. } => Some(len),
            Write::Delete { .. } => None,
        }
    }

    /// Its form in a report line.
    fn report(&self) -> String {
        match self {
            Write::Put { ks, slot, len } => format!("put {ks} {slot} {len}"),
            Write::Delete { ks, slot } => format!("del {ks} {slot}"),
            Write::Rmw { slot, len } => format!("rmw {slot} {len}"),
            Write::Batch { ks, slots, len } => {
                format!("batch {} {} {} {} {len}", ks[0], slots[0], ks[1], slots[1])
            }
        }
    }

    /// Parses [`Write::report`]'s form.
    fn parse(words: &[&str]) -> Result<Write, String> {
        fn num<T: std::str::FromStr>(word: Option<&&str>, what: &str) -> Result<T, String> {
            let word = word.ok_or_else(|| format!("no {what}"))?;
            word.parse()
                .map_err(|_| format!("{what} {word:?} is not a number"))
        }
        let keyspace = |word: Option<&&str>| -> Result<usize, String> {
            let ks: usize = num(word, "keyspace")?;
            if ks < KEYSPACES.len() {
                Ok(ks)
            } else {
                Err(format!("no keyspace {ks}"))
            }
        };
        let write = match words.first() {
            Some(&"put") => Write::Put {
                ks: keyspace(words.get(1))?,
                slot: num(words.get(2), "slot")?,
                len: num(words.get(3), "length")?,
            },
            Some(&"del") => Write::Delete {
                ks: keyspace(words.get(1))?,
                slot: num(words.get(2), "slot")?,
            },
            Some(&"rmw") => Write::Rmw {
                slot: num(words.get(1), "slot")?,
                len: num(words.get(2), "length")?,
            },
            Some(&"batch") => {
                let ks = [keyspace(words.get(1))?, keyspace(words.get(3))?];
                if ks[0] == ks[1] {
                    return Err(format!("a batch of two keys of keyspace {}", ks[0]));
                }
                Write::Batch {
                    ks,
                    slots: [num(words.get(2), "slot")?, num(words.get(4), "slot")?],
                    len: num(words.get(5), "length")?,
                }
            }
            other => return Err(format!("unknown write {other:?}")),
        };
        let expected = match write {
            Write::Delete { .. } | Write::Rmw { .. } => 3,
            Write::Put { .. } => 4,
            Write::Batch { .. } => 6,
        };
        if words.len() != expected {
            return Err(format!("{} words where {expected} belong", words.len()));
        }
        Ok(write)
    }
}

/// A line the child reports.
#[derive(Debug)]
enum Report {
    /// The database is open and the writers start.
    Ready,
    /// This write is about to be issued.
    Try(WriteId, Write),
    /// This write returned `Ok`.
    Ack(WriteId),
    /// What the hash keyspace has done since the child opened the database.
    Hash(HashCounts),
    /// Something failed in the child (which then exits).
    Failed(String),
}

/// What a child's hash keyspace did: [`bfdb::HashStoreStats`]'s counts that tell whether
/// the run reached the hot log's disk and the compactions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct HashCounts {
    hot_cold_compactions: u64,
    cold_cold_compactions: u64,
    records_copied: u64,
    throttled_writes: u64,
    hot_disk_reads: u64,
}

impl HashCounts {
    fn of(store: &HashStore) -> HashCounts {
        let s = store.stats();
        HashCounts {
            hot_cold_compactions: s.hot_cold_compactions,
            cold_cold_compactions: s.cold_cold_compactions,
            records_copied: s.records_copied,
            throttled_writes: s.throttled_writes,
            hot_disk_reads: s.hot_disk_reads,
        }
    }

    fn report(&self) -> String {
        format!(
            "hash {} {} {} {} {}",
            self.hot_cold_compactions,
            self.cold_cold_compactions,
            self.records_copied,
            self.throttled_writes,
            self.hot_disk_reads
        )
    }

    fn parse(words: &[&str]) -> Result<HashCounts, String> {
        let n: Vec<u64> = words
            .iter()
            .map(|w| w.parse().map_err(|_| format!("{w:?} is not a number")))
            .collect::<Result<_, _>>()?;
        let &[
            hot_cold_compactions,
            cold_cold_compactions,
            records_copied,
            throttled_writes,
            hot_disk_reads,
        ] = &n[..]
        else {
            return Err(format!("{} numbers where 5 belong", n.len()));
        };
        Ok(HashCounts {
            hot_cold_compactions,
            cold_cold_compactions,
            records_copied,
            throttled_writes,
            hot_disk_reads,
        })
    }

    fn add(&mut self, other: &HashCounts) {
        self.hot_cold_compactions += other.hot_cold_compactions;
        self.cold_cold_compactions += other.cold_cold_compactions;
        self.records_copied += other.records_copied;
        self.throttled_writes += other.throttled_writes;
        self.hot_disk_reads += other.hot_disk_reads;
    }
}

fn parse_report(line: &str) -> Result<Report, String> {
    let words: Vec<&str> = line.split(' ').collect();
    let id = |word: Option<&&str>| {
        word.and_then(|w| WriteId::parse(w))
            .ok_or_else(|| format!("no write id in {word:?}"))
    };
    match words.first() {
        Some(&"ready") if words.len() == 1 => Ok(Report::Ready),
        Some(&"try") => Ok(Report::Try(id(words.get(1))?, Write::parse(&words[2..])?)),
        Some(&"ack") if words.len() == 2 => Ok(Report::Ack(id(words.get(1))?)),
        Some(&"hash") => Ok(Report::Hash(HashCounts::parse(&words[1..])?)),
        Some(&"failed") => Ok(Report::Failed(line["failed".len()..].trim().to_string())),
        _ => Err("not a report".into()),
    }
}

// ---------------------------------------------------------------------------------------
// The child
// ---------------------------------------------------------------------------------------

/// The child process of `sigkilled_writers_lose_no_acknowledged_write`: writes until it
/// is killed. Without its environment (a plain `--ignored` run) it returns at once.
#[test]
#[ignore = "the child process of the kill test; it runs when that test starts it"]
fn child_process_entry() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let run = env_u64(CHILD_RUN).expect("BFDB_KILL_CHILD_RUN: the run number");
    let seed = env_u64(CHILD_SEED).expect("BFDB_KILL_CHILD_SEED: the child's seed");
    let long_keys = env_u64(CHILD_LONG_KEYS) == Some(1);
    run_child(Path::new(&dir), run, seed, long_keys);
}

/// The child's stdout: each report one whole line in one `write(2)` (a pipe write of
/// under 4 KiB is atomic, so a kill never leaves half a line), never two interleaved.
struct Reporter(Mutex<()>);

impl Reporter {
    fn say(&self, report: &str) {
        let line = format!("{MARK}{report}\n");
        let _one_at_a_time = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = std::io::stdout().lock();
        if out
            .write_all(line.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            // The parent is gone: nobody is listening.
            std::process::exit(2);
        }
    }

    /// Reports a failure and ends the process, which the parent finds it did on its own.
    fn fail(&self, what: &str) -> ! {
        self.say(&format!("failed {}", what.replace('\n', " / ")));
        std::process::exit(3);
    }
}

fn run_child(dir: &Path, run: u64, seed: u64, long_keys: bool) -> ! {
    let out = Arc::new(Reporter(Mutex::new(())));
    let db = Db::open(dir, options(long_keys)).unwrap_or_else(|e| out.fail(&format!("open: {e}")));
    let db = Arc::new(db);
    let trees: Vec<Arc<Tree>> = KEYSPACES[..HASH]
        .iter()
        .map(|name| {
            db.tree(name)
                .unwrap_or_else(|e| out.fail(&format!("keyspace {name}: {e}")))
        })
        .collect();
    let hash = db
        .hash_store_with(KEYSPACES[HASH], hash_options(long_keys))
        .unwrap_or_else(|e| out.fail(&format!("keyspace {}: {e}", KEYSPACES[HASH])));
    let keyspaces = Arc::new(ChildKeyspaces {
        trees,
        hash,
        long_keys,
    });
    out.say("ready");
    let threads = 2 + seed % 3;
    let writers: Vec<_> = (0..threads)
        .map(|thread| {
            let (db, ks, out) = (Arc::clone(&db), Arc::clone(&keyspaces), Arc::clone(&out));
            std::thread::spawn(move || child_writer(&db, &ks, &out, run, thread, seed))
        })
        .collect();
    {
        let (keyspaces, out) = (Arc::clone(&keyspaces), Arc::clone(&out));
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(50));
                out.say(&HashCounts::of(&keyspaces.hash).report());
            }
        });
    }
    for writer in writers {
        let _ = writer.join();
    }
    out.fail("a writer thread ended")
}

/// A key slot: half the time one of the hot ones; with `long_keys`, one in three a
/// slot of a long key.
fn pick_slot(rng: &mut Rng, long_keys: bool) -> u64 {
    let (from, slots) = match long_keys && rng.below(3) == 0 {
        true => (LONG_SLOTS_FROM, LONG_SLOTS),
        false => (0, SLOTS),
    };
    if rng.below(2) == 0 {
        from + rng.below(HOT_SLOTS)
    } else {
        from + rng.below(slots)
    }
}

/// The keyspaces a child writes.
struct ChildKeyspaces {
    /// The trees, in the order of [`KEYSPACES`].
    trees: Vec<Arc<Tree>>,
    hash: Arc<HashStore>,
    /// Whether a third of the writes take long keys.
    long_keys: bool,
}

/// One writer thread of the child: reports each write, issues it at `Synced`, reports
/// it acknowledged; forever.
fn child_writer(
    db: &Db,
    ks: &ChildKeyspaces,
    out: &Reporter,
    run: u64,
    thread: u64,
    seed: u64,
) -> ! {
    let mut rng = Rng(mix(seed ^ mix(thread + 1)));
    let long_keys = ks.long_keys;
    let mut counter = 0;
    loop {
        let id = WriteId {
            run,
            thread,
            counter,
        };
        counter += 1;
        // Values of 40 bytes to 2 KB in the trees, so that their leaf pages are evicted,
        // and one in ten of 2 KB to 300 KB, which the value store keeps (a value is its
        // write's header and letters drawn from it, so a torn one names no write); up
        // to 600 bytes in the hash keyspace, so that the data it holds stays well
        // within its cold log's budget and compaction frees space, and there too one in
        // ten of 2 KB to 300 KB, which the value store keeps (its record a reference).
        let long = match rng.below(10) {
            0 => 2_049 + rng.below(300_000) as usize,
            _ => 40 + rng.below(1960) as usize,
        };
        let short = match rng.below(10) {
            0 => 2_049 + rng.below(300_000) as usize,
            _ => 40 + rng.below(560) as usize,
        };
        let write = match rng.percent() {
            0..55 => {
                let ks = rng.below(KEYSPACES.len() as u64) as usize;
                Write::Put {
                    ks,
                    slot: pick_slot(&mut rng, long_keys),
                    len: if ks == HASH { short } else { long },
                }
            }
            55..67 => Write::Delete {
                ks: rng.below(KEYSPACES.len() as u64) as usize,
                slot: pick_slot(&mut rng, long_keys),
            },
            67..77 => Write::Rmw {
                slot: pick_slot(&mut rng, long_keys),
                len: short,
            },
            // Both trees, or a tree and the hash keyspace (either first).
            p => {
                let tree = rng.below(HASH as u64) as usize;
                let ks = match p {
                    77..88 => [tree, 1 - tree],
                    88..94 => [tree, HASH],
                    _ => [HASH, tree],
                };
                Write::Batch {
                    ks,
                    slots: [
                        pick_slot(&mut rng, long_keys),
                        pick_slot(&mut rng, long_keys),
                    ],
                    len: if ks.contains(&HASH) { short } else { long },
                }
            }
        };
        out.say(&format!("try {id} {}", write.report()));
        let synced = Durability::Synced;
        let done = match write {
            Write::Put {
                ks: HASH,
                slot,
                len,
            } => ks
                .hash
                .insert_with(&key_of(slot), &value_of(id, len), synced),
            Write::Put { ks: k, slot, len } => {
                ks.trees[k].insert_with(&key_of(slot), &value_of(id, len), synced)
            }
            Write::Delete { ks: HASH, slot } => ks.hash.delete_with(&key_of(slot), synced),
            Write::Delete { ks: k, slot } => ks.trees[k].delete_with(&key_of(slot), synced),
            Write::Rmw { slot, len } => {
                let value = value_of(id, len);
                ks.hash
                    .rmw_with(
                        &key_of(slot),
                        |old| {
                            // What the store holds must be what some write stored.
                            if let Some(old) = old
                                && writer_of(old).is_none_or(|w| value_of(w, old.len()) != old)
                            {
                                out.fail(&format!(
                                    "rmw {id} of hash key {slot} read {}, which no write stored",
                                    show_value(Some(old))
                                ));
                            }
                            value.clone()
                        },
                        synced,
                    )
                    .and_then(|stored| {
                        if stored == value {
                            Ok(())
                        } else {
                            out.fail(&format!("rmw {id} returned another value"))
                        }
                    })
            }
            Write::Batch { ks: k, slots, len } => {
                let value = value_of(id, len);
                let mut batch = WriteBatch::new();
                for (k, slot) in k.into_iter().zip(slots) {
                    match k {
                        HASH => batch.insert_hash(&ks.hash, &key_of(slot), &value),
                        k => batch.insert(&ks.trees[k], &key_of(slot), &value),
                    }
                }
                db.write_with(batch, synced)
            }
        };
        if let Err(e) = done {
            out.fail(&format!("write {id} ({}): {e}", write.report()));
        }
        out.say(&format!("ack {id}"));
    }
}

// ---------------------------------------------------------------------------------------
// Running and killing a child
// ---------------------------------------------------------------------------------------

/// When the parent kills a child.
#[derive(Clone, Copy, Debug)]
enum KillAt {
    /// This long after starting it: often while it opens and recovers the database.
    AfterSpawn(Duration),
    /// This long after it reported the database open.
    AfterReady(Duration),
}

/// What a killed child reported.
struct KilledChild {
    /// Its report lines (without the mark), in order.
    lines: Vec<String>,
    /// The last line of its stdout if the kill cut it short.
    partial: Option<String>,
}

/// Kills (and reaps) the child if the parent stops early.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends the report lines of the child's stdout to `lines`; returns its last line if
/// it has no newline.
fn forward_reports(stdout: impl Read, lines: &mpsc::Sender<String>) -> Option<String> {
    let mut reader = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .expect("reading the child's stdout");
        if n == 0 {
            return None;
        }
        let text = String::from_utf8_lossy(&buf);
        let Some(line) = text.strip_suffix('\n') else {
            return Some(text.into_owned());
        };
        // The harness may print "test child_process_entry ... " before the first report.
        if let Some(at) = line.find(MARK) {
            let _ = lines.send(line[at + MARK.len()..].to_string());
        }
    }
}

/// Starts a child on `dir` and SIGKILLs it `at` the moment given. `Err` if the child
/// ended on its own.
fn run_child_until_killed(
    dir: &Path,
    run: u64,
    seed: u64,
    long_keys: bool,
    at: KillAt,
) -> Result<KilledChild, String> {
    let exe = std::env::current_exe().expect("the path of this test binary");
    let child = Command::new(exe)
        .args([
            "child_process_entry",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir)
        .env(CHILD_RUN, run.to_string())
        .env(CHILD_SEED, seed.to_string())
        .env(CHILD_LONG_KEYS, u8::from(long_keys).to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the child process");
    let mut child = KillOnDrop(child);
    let stdout = child.0.stdout.take().expect("the child's stdout is piped");
    let mut stderr = child.0.stderr.take().expect("the child's stderr is piped");
    let (send, receive) = mpsc::channel();
    let stdout_reader = std::thread::spawn(move || forward_reports(stdout, &send));
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    let mut lines = Vec::new();
    let wait = match at {
        KillAt::AfterSpawn(wait) => wait,
        KillAt::AfterReady(wait) => {
            loop {
                match receive.recv_timeout(HANG_GUARD) {
                    Ok(line) => {
                        let ready = line == "ready";
                        lines.push(line);
                        if ready {
                            break;
                        }
                    }
                    // It ended: the status below tells how.
                    Err(RecvTimeoutError::Disconnected) => break,
                    Err(RecvTimeoutError::Timeout) => {
                        return Err(format!(
                            "the child did not report the database open within {HANG_GUARD:?}"
                        ));
                    }
                }
            }
            wait
        }
    };
    std::thread::sleep(wait);
    // `Child::kill` sends SIGKILL.
    child.0.kill().expect("killing the child");
    let status = child.0.wait().expect("reaping the child");
    let partial = stdout_reader.join().expect("the stdout reader panicked");
    let stderr = stderr_reader.join().expect("the stderr reader panicked");
    lines.extend(receive.try_iter());
    if status.signal() != Some(libc::SIGKILL) {
        let last = &lines[lines.len().saturating_sub(5)..];
        return Err(format!(
            "the child ended on its own ({status}) before it was killed; its last reports: \
             {last:?}; its stderr:\n{stderr}"
        ));
    }
    Ok(KilledChild { lines, partial })
}

// ---------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------

/// One write a child reported trying.
#[derive(Debug)]
struct Tried {
    id: WriteId,
    write: Write,
    /// The index of its `try` line, and of its `ack` line if it has one.
    tried_at: usize,
    acked_at: Option<usize>,
}

/// What one child reported.
#[derive(Debug, Default)]
struct RunLog {
    run: u64,
    ready: bool,
    /// The hash keyspace's counts the child reported last.
    hash: HashCounts,
    writes: Vec<Tried>,
    by_id: HashMap<WriteId, usize>,
    /// The writes of each key, in the order they were tried.
    by_key: BTreeMap<Key, Vec<usize>>,
}

impl RunLog {
    fn parse(run: u64, lines: &[String]) -> Result<RunLog, String> {
        let mut log = RunLog {
            run,
            ..RunLog::default()
        };
        for (at, line) in lines.iter().enumerate() {
            let bad = |why: String| format!("the child's report {at} ({line:?}): {why}");
            match parse_report(line).map_err(bad)? {
                Report::Ready => log.ready = true,
                Report::Hash(counts) => log.hash = counts,
                Report::Failed(why) => return Err(bad(format!("the child failed: {why}"))),
                Report::Try(id, write) => {
                    if id.run != run {
                        return Err(bad(format!("a write of run {} in run {run}", id.run)));
                    }
                    let i = log.writes.len();
                    if log.by_id.insert(id, i).is_some() {
                        return Err(bad("a write tried twice".into()));
                    }
                    for key in write.keys() {
                        log.by_key.entry(key).or_default().push(i);
                    }
                    log.writes.push(Tried {
                        id,
                        write,
                        tried_at: at,
                        acked_at: None,
                    });
                }
                Report::Ack(id) => {
                    let i = *log
                        .by_id
                        .get(&id)
                        .ok_or_else(|| bad("the ack of a write never tried".into()))?;
                    if log.writes[i].acked_at.replace(at).is_some() {
                        return Err(bad("a write acknowledged twice".into()));
                    }
                }
            }
        }
        Ok(log)
    }

    /// Whether write `a` returned before write `b` was issued, and so precedes it in
    /// the log.
    fn definitely_before(&self, a: usize, b: usize) -> bool {
        self.writes[a]
            .acked_at
            .is_some_and(|acked| acked < self.writes[b].tried_at)
    }

    /// Whether `origin` may be the last write of a key whose writes this run are
    /// `writes`: no acknowledged write of them definitely follows it.
    fn may_be_last(&self, origin: Origin, writes: &[usize]) -> bool {
        match origin {
            Origin::Earlier => writes.iter().all(|&j| self.writes[j].acked_at.is_none()),
            Origin::Write(i) => !writes
                .iter()
                .any(|&j| self.writes[j].acked_at.is_some() && self.definitely_before(i, j)),
        }
    }

    /// The last acknowledged write of a key, for messages.
    fn describe_last_acked(&self, writes: &[usize]) -> String {
        match writes
            .iter()
            .filter_map(|&j| Some((self.writes[j].acked_at?, j)))
            .max()
        {
            Some((at, j)) => format!(
                "{} ({}), acknowledged in report {at}",
                self.writes[j].id,
                self.writes[j].write.report()
            ),
            None => "what the previous recovery found".into(),
        }
    }
}

/// Where a key's recovered value (or absence) may come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// What the previous recovery found (before this run wrote).
    Earlier,
    /// A write of this run (an index into `RunLog::writes`).
    Write(usize),
}

/// What the recoveries so far found.
#[derive(Debug, Default)]
struct Model {
    /// Every present key and its value, as the last recovery found them.
    values: BTreeMap<Key, Vec<u8>>,
    /// Every key a write ever named.
    touched: BTreeSet<Key>,
}

/// A failed check.
#[derive(Debug)]
enum Violation {
    /// An acknowledged write is missing: the key holds something older.
    Lost {
        key: String,
        found: String,
        expected: String,
    },
    /// A value no write stored, or a key no write named.
    Garbage {
        key: String,
        found: String,
        why: String,
    },
    /// One key of a batch has its value, another neither it nor a later write.
    HalfBatch {
        batch: WriteId,
        key: String,
        found: String,
    },
    /// A scan disagrees with the point reads.
    Scan { key: String, why: String },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Lost {
                key,
                found,
                expected,
            } => write!(
                f,
                "LOST {key}: found {found}, but the last acknowledged write is {expected}"
            ),
            Violation::Garbage { key, found, why } => write!(f, "GARBAGE {key}: {found}: {why}"),
            Violation::HalfBatch { batch, key, found } => write!(
                f,
                "HALF BATCH {batch}: {key} holds {found}, neither the batch's value nor a later write's"
            ),
            Violation::Scan { key, why } => write!(f, "SCAN {key}: {why}"),
        }
    }
}

/// The origins `got` may have under `key`: `Err` if no write of the key stored it.
/// An empty list means an earlier value the key had lost since (a loss).
fn origins(
    log: &RunLog,
    earlier: Option<&Vec<u8>>,
    writes: &[usize],
    got: Option<&[u8]>,
) -> Result<Vec<Origin>, String> {
    let Some(value) = got else {
        let mut origins: Vec<Origin> = writes
            .iter()
            .filter(|&&i| matches!(log.writes[i].write, Write::Delete { .. }))
            .map(|&i| Origin::Write(i))
            .collect();
        if earlier.is_none() {
            origins.push(Origin::Earlier);
        }
        return Ok(origins);
    };
    let id = writer_of(value).ok_or("a value that names no write")?;
    if id.run != log.run {
        return if earlier.is_some_and(|e| e == value) {
            Ok(vec![Origin::Earlier])
        } else if id.run < log.run {
            // Written by an earlier child, but not what the last recovery found.
            Ok(Vec::new())
        } else {
            Err(format!("{id} is of a run not started yet"))
        };
    }
    let &i = log
        .by_id
        .get(&id)
        .ok_or_else(|| format!("{id} was never tried"))?;
    if !writes.contains(&i) {
        return Err(format!(
            "{id} ({}) wrote other keys",
            log.writes[i].write.report()
        ));
    }
    let len = log.writes[i]
        .write
        .value_len()
        .ok_or_else(|| format!("{id} is a delete"))?;
    if value_of(id, len) != value {
        return Err(format!(
            "named {id}, but not the bytes it wrote ({len} bytes)"
        ));
    }
    Ok(vec![Origin::Write(i)])
}

/// What checking a run found, besides violations.
#[derive(Debug, Default)]
struct RunCounts {
    acked_puts: u64,
    acked_deletes: u64,
    acked_rmws: u64,
    acked_batches: u64,
    acked_hash: u64,
    /// Acknowledged writes of a long key (a batch counts once).
    acked_long: u64,
    /// Puts and batches tried and not acknowledged, and how many of them recovery kept.
    in_flight: u64,
    in_flight_kept: u64,
}

/// Checks `found` (every key of `model.touched` and of `log`, as recovery left it)
/// against what the previous recovery found and what the child reported.
fn check_run(model: &Model, log: &RunLog, found: &Found) -> (Vec<Violation>, RunCounts) {
    let mut violations = Vec::new();
    let mut origins_of: BTreeMap<&Key, Vec<Origin>> = BTreeMap::new();
    for key in model.touched.iter().chain(log.by_key.keys()) {
        assert!(found.contains_key(key), "{} was not read", show_key(key));
    }
    for (key, got) in found {
        let earlier = model.values.get(key);
        let writes = log.by_key.get(key).map_or(&[][..], Vec::as_slice);
        let origins = match origins(log, earlier, writes, got.as_deref()) {
            Ok(origins) => origins,
            Err(why) => {
                violations.push(Violation::Garbage {
                    key: show_key(key),
                    found: show_value(got.as_deref()),
                    why,
                });
                continue;
            }
        };
        if !origins.iter().any(|&o| log.may_be_last(o, writes)) {
            violations.push(Violation::Lost {
                key: show_key(key),
                found: show_value(got.as_deref()),
                expected: log.describe_last_acked(writes),
            });
        }
        origins_of.insert(key, origins);
    }

    let mut counts = RunCounts::default();
    for (i, tried) in log.writes.iter().enumerate() {
        let keys = tried.write.keys();
        match (&tried.write, tried.acked_at.is_some()) {
            (Write::Put { .. }, true) => counts.acked_puts += 1,
            (Write::Delete { .. }, true) => counts.acked_deletes += 1,
            (Write::Rmw { .. }, true) => counts.acked_rmws += 1,
            (Write::Batch { .. }, true) => counts.acked_batches += 1,
            (_, false) => {}
        }
        if tried.acked_at.is_some() && keys.iter().any(|k| k.0 == HASH) {
            counts.acked_hash += 1;
        }
        if tried.acked_at.is_some() && keys.iter().any(|k| k.1.len() > 16) {
            counts.acked_long += 1;
        }
        let shows: Vec<bool> = keys
            .iter()
            .map(|k| {
                origins_of
                    .get(k)
                    .is_some_and(|o| o.contains(&Origin::Write(i)))
            })
            .collect();
        // (An absence cannot tell which delete made it: deletes are not counted.)
        if tried.acked_at.is_none() && tried.write.value_len().is_some() {
            counts.in_flight += 1;
            counts.in_flight_kept += u64::from(shows.contains(&true));
        }
        if !matches!(tried.write, Write::Batch { .. }) || !shows.contains(&true) {
            continue;
        }
        for (key, _) in keys.iter().zip(&shows).filter(|(_, shown)| !**shown) {
            // Without the batch's value, the key must hold a write that may follow it.
            let replaced = origins_of.get(key).is_some_and(|origins| {
                origins.iter().any(|o| match *o {
                    Origin::Write(j) => j != i && !log.definitely_before(j, i),
                    Origin::Earlier => false,
                })
            });
            if !replaced {
                violations.push(Violation::HalfBatch {
                    batch: tried.id,
                    key: show_key(key),
                    found: show_value(found[key].as_deref()),
                });
            }
        }
    }
    (violations, counts)
}

/// Reads every key of `keys` from the reopened database (of the run of long keys, with
/// `long_keys`), and scans the tree keyspaces: what it found, the scans' disagreements
/// with it, and the trees' evictions.
fn read_back(
    db: &Db,
    keys: &BTreeSet<Key>,
    long_keys: bool,
) -> Result<(Found, Vec<Violation>, u64), String> {
    let mut trees = Vec::new();
    for name in &KEYSPACES[..HASH] {
        trees.push(db.tree(name).map_err(|e| format!("keyspace {name}: {e}"))?);
    }
    let hash = db
        .hash_store_with(KEYSPACES[HASH], hash_options(long_keys))
        .map_err(|e| format!("keyspace {}: {e}", KEYSPACES[HASH]))?;
    let mut violations = Vec::new();
    if db.keyspaces() != KEYSPACES {
        violations.push(Violation::Scan {
            key: "(the keyspace list)".into(),
            why: format!("{:?}, not {KEYSPACES:?}", db.keyspaces()),
        });
    }
    let mut found = BTreeMap::new();
    for key in keys {
        let got = match key.0 {
            HASH => hash.get(&key.1),
            ks => trees[ks].get(&key.1),
        }
        .map_err(|e| format!("get {}: {e}", show_key(key)))?;
        found.insert(key.clone(), got);
    }
    for (ks, tree) in trees.iter().enumerate() {
        let scanned = tree
            .range::<&[u8], _>(..)
            .collect::<bfdb::Result<Vec<_>>>()
            .map_err(|e| format!("scan of {}: {e}", KEYSPACES[ks]))?;
        let mut unseen: BTreeMap<&[u8], &[u8]> = found
            .iter()
            .filter(|(key, _)| key.0 == ks)
            .filter_map(|(key, value)| Some((&key.1[..], value.as_deref()?)))
            .collect();
        let mut previous: Option<&[u8]> = None;
        for (k, v) in &scanned {
            let key = (ks, k.clone());
            if previous.is_some_and(|p| p >= &k[..]) {
                violations.push(Violation::Scan {
                    key: show_key(&key),
                    why: "out of order or repeated".into(),
                });
            }
            previous = Some(k);
            if !keys.contains(&key) {
                violations.push(Violation::Garbage {
                    key: show_key(&key),
                    found: show_value(Some(v)),
                    why: "the scan yields a key no write named".into(),
                });
                continue;
            }
            match unseen.remove(&k[..]) {
                Some(point) if point == &v[..] => {}
                Some(point) => violations.push(Violation::Scan {
                    key: show_key(&key),
                    why: format!(
                        "yields {}, get finds {}",
                        show_value(Some(v)),
                        show_value(Some(point))
                    ),
                }),
                None => violations.push(Violation::Scan {
                    key: show_key(&key),
                    why: format!("yields {}, get finds none", show_value(Some(v))),
                }),
            }
        }
        for (k, v) in unseen {
            violations.push(Violation::Scan {
                key: show_key(&(ks, k.to_vec())),
                why: format!("get finds {}, the scan misses it", show_value(Some(v))),
            });
        }
    }
    let evictions = trees.iter().map(|t| t.stats().evictions).sum();
    Ok((found, violations, evictions))
}

// ---------------------------------------------------------------------------------------
// The parent
// ---------------------------------------------------------------------------------------

/// The totals of all runs.
#[derive(Debug, Default)]
struct Totals {
    kills: u64,
    kills_before_ready: u64,
    acked_puts: u64,
    acked_deletes: u64,
    acked_rmws: u64,
    acked_batches: u64,
    /// Acknowledged writes of the hash keyspace (a batch counts once).
    acked_hash: u64,
    /// Acknowledged writes of a long key (a batch counts once).
    acked_long: u64,
    in_flight: u64,
    in_flight_kept: u64,
    /// What the children's hash keyspaces did, as each reported last before its kill.
    hash: HashCounts,
    /// Kills that tore the log's tail: recoveries that discarded more bytes than the
    /// one before (a torn tail stays in the log, and every later recovery discards it
    /// again), and the bytes and records the last recovery discarded.
    torn_tails: u64,
    discarded_bytes: u64,
    discarded_records: u64,
    partial_lines: u64,
    losses: u64,
    records_replayed: u64,
    evictions: u64,
    /// The parent's time in recovery, in all runs and in the last one.
    recovery_time: Duration,
    last_recovery: Duration,
}

impl Totals {
    fn acked(&self) -> u64 {
        self.acked_puts + self.acked_deletes + self.acked_rmws + self.acked_batches
    }
}

/// Why a run failed: a message, and the child's reports to keep with the directory.
struct RunFailure {
    message: String,
    lines: Vec<String>,
}

/// One run: start a child (writing long keys too, with `long_keys`), kill it, recover,
/// check, and move `model` on.
fn kill_and_check(
    dir: &Path,
    run: u64,
    long_keys: bool,
    rng: &mut Rng,
    model: &mut Model,
    totals: &mut Totals,
) -> Result<(), RunFailure> {
    let child_seed = rng.next_u64();
    let at = if rng.below(8) == 0 {
        KillAt::AfterSpawn(Duration::from_millis(rng.below(40)))
    } else {
        KillAt::AfterReady(Duration::from_millis(20 + rng.below(281)))
    };
    let fail = |lines: &[String], message: String| RunFailure {
        message,
        lines: lines.to_vec(),
    };
    let child =
        run_child_until_killed(dir, run, child_seed, long_keys, at).map_err(|m| fail(&[], m))?;
    let lines = &child.lines;
    totals.kills += 1;
    if let Some(partial) = &child.partial
        && partial.contains(MARK)
    {
        totals.partial_lines += 1;
    }
    let log = RunLog::parse(run, lines).map_err(|m| fail(lines, m))?;
    if !log.ready {
        totals.kills_before_ready += 1;
    }
    model.touched.extend(log.by_key.keys().cloned());

    let db =
        Db::open(dir, options(long_keys)).map_err(|e| fail(lines, format!("reopening: {e}")))?;
    let recovery = db.recovery().clone();
    let (found, mut violations, evictions) =
        read_back(&db, &model.touched, long_keys).map_err(|m| fail(lines, m))?;
    // The directory must be free for the next child.
    drop(db);

    let (checked, counts) = check_run(model, &log, &found);
    violations.extend(checked);
    totals.losses += violations
        .iter()
        .filter(|v| matches!(v, Violation::Lost { .. }))
        .count() as u64;
    if !violations.is_empty() {
        let shown: Vec<String> = violations.iter().take(30).map(|v| v.to_string()).collect();
        return Err(fail(
            lines,
            format!(
                "run {run} (child seed {child_seed}, killed {at:?}, {} reports, recovery {recovery:?}): \
                 {} violations:\n  {}",
                lines.len(),
                violations.len(),
                shown.join("\n  ")
            ),
        ));
    }

    model.values = found
        .into_iter()
        .filter_map(|(key, value)| Some((key, value?)))
        .collect();
    totals.acked_puts += counts.acked_puts;
    totals.acked_deletes += counts.acked_deletes;
    totals.acked_rmws += counts.acked_rmws;
    totals.acked_batches += counts.acked_batches;
    totals.acked_hash += counts.acked_hash;
    totals.acked_long += counts.acked_long;
    totals.hash.add(&log.hash);
    totals.in_flight += counts.in_flight;
    totals.in_flight_kept += counts.in_flight_kept;
    totals.torn_tails += u64::from(recovery.discarded_bytes > totals.discarded_bytes);
    totals.discarded_bytes = recovery.discarded_bytes;
    totals.discarded_records = recovery.discarded_records;
    totals.records_replayed = recovery.records_replayed;
    totals.evictions = evictions;
    totals.recovery_time += recovery.duration;
    totals.last_recovery = recovery.duration;
    Ok(())
}

/// The log segments in `dir`, and how many of them have no header (all zeros where it
/// belongs): a kill stopped their creation.
fn log_segments(dir: &Path) -> (usize, usize) {
    let (mut segments, mut headerless) = (0, 0);
    for entry in std::fs::read_dir(dir).expect("listing the database directory") {
        let path = entry.expect("listing the database directory").path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with("wal-") && name.ends_with(".log") {
            segments += 1;
            let mut header = [0u8; 4096];
            let read = std::fs::File::open(&path)
                .and_then(|f| std::os::unix::fs::FileExt::read_at(&f, &mut header, 0))
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            headerless += usize::from(header[..read].iter().all(|&b| b == 0));
        }
    }
    (segments, headerless)
}

/// The issue's test: children killed at random moments lose no acknowledged write and
/// leave no garbage (see the module docs).
#[test]
fn sigkilled_writers_lose_no_acknowledged_write() {
    kill_campaign("db_kill", false, DEFAULT_KILLS);
}

/// The same with 16 KiB leaf pages, a third of the writes to keys of up to 4 KiB
/// (issue #34).
#[test]
fn sigkilled_writers_of_long_keys_lose_no_acknowledged_write() {
    kill_campaign("db_kill_long_keys", true, DEFAULT_LONG_KEY_KILLS);
}

/// Kills children one after the other on one database (with `long_keys`, of long keys
/// too), `BFDB_KILLS` times or `default_kills`, and checks each recovery.
fn kill_campaign(test: &str, long_keys: bool, default_kills: u64) {
    let kills = env_u64("BFDB_KILLS").unwrap_or(default_kills);
    let seed = common::seed(test);
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let started = Instant::now();
    let mut model = Model::default();
    let mut totals = Totals::default();
    for run in 0..kills {
        let done = kill_and_check(
            dir.path(),
            run,
            long_keys,
            &mut rng,
            &mut model,
            &mut totals,
        );
        if let Err(failure) = done {
            let kept = dir.keep();
            let reports = kept.join(format!("child-run-{run}.txt"));
            let _ = std::fs::write(&reports, failure.lines.join("\n"));
            panic!(
                "{test} (seed {seed}): {}\nthe database directory is kept at {} and the \
                 child's reports in {}\ntotals so far: {totals:?}",
                failure.message,
                kept.display(),
                reports.display()
            );
        }
    }
    let (segments, headerless) = log_segments(dir.path());
    let acked = totals.acked();
    println!(
        "{test}: {} kills ({} before the child reported the database open) in {:.1?}; \
         {acked} acknowledged writes checked ({} puts, {} deletes, {} read-modify-writes, \
         {} batches; {} of them wrote the hash keyspace, {} a long key), {} lost; \
         {} puts, read-modify-writes and batches in flight at a kill, {} of them recovered; \
         {} kills tore the log's tail (the last recovery discarded {} bytes, {} records); \
         the parent's recoveries took {:.1?}, the last {:.1?} for {} log records, and its \
         trees evicted {} mini-pages; the children's hash keyspaces ran {} hot→cold and {} \
         cold→cold compactions (copying {} records), throttled {} writes and read {} \
         records from the hot log's disk; {segments} log segments, {headerless} of them \
         left without a header by a kill during their creation; {} half report lines",
        totals.kills,
        totals.kills_before_ready,
        started.elapsed(),
        totals.acked_puts,
        totals.acked_deletes,
        totals.acked_rmws,
        totals.acked_batches,
        totals.acked_hash,
        totals.acked_long,
        totals.losses,
        totals.in_flight,
        totals.in_flight_kept,
        totals.torn_tails,
        totals.discarded_bytes,
        totals.discarded_records,
        totals.recovery_time,
        totals.last_recovery,
        totals.records_replayed,
        totals.evictions,
        totals.hash.hot_cold_compactions,
        totals.hash.cold_cold_compactions,
        totals.hash.records_copied,
        totals.hash.throttled_writes,
        totals.hash.hot_disk_reads,
        totals.partial_lines,
    );
    assert_eq!(totals.kills, kills);
    assert_eq!(totals.losses, 0);
    // A guard against checking nothing (reports no longer parsed, say).
    assert!(acked > 0, "no write was acknowledged in {kills} runs");
    assert!(
        totals.acked_hash > 0,
        "no write of the hash keyspace was acknowledged in {kills} runs"
    );
    assert_eq!(
        totals.acked_long > 0,
        long_keys,
        "{} writes of long keys acknowledged in {kills} runs",
        totals.acked_long
    );
}

// ---------------------------------------------------------------------------------------
// The checker's own test
// ---------------------------------------------------------------------------------------

/// The checker flags each kind of wrong recovery, and accepts each right one.
#[test]
fn the_checker_flags_lost_writes_garbage_and_half_batches() {
    let w = |thread, counter| WriteId {
        run: 1,
        thread,
        counter,
    };
    let reports = [
        "ready",
        // alpha/key00005: c0 acknowledged, c1 in flight at the kill.
        "try r1.t0.c0 put 0 5 100",
        "ack r1.t0.c0",
        "try r1.t0.c1 put 0 5 90",
        // beta/key00006: two overlapping writes, both acknowledged: either may be last.
        "try r1.t1.c0 put 1 6 80",
        "try r1.t2.c0 put 1 6 70",
        "ack r1.t2.c0",
        "ack r1.t1.c0",
        // alpha/key00007: one write after the other.
        "try r1.t2.c1 put 0 7 60",
        "ack r1.t2.c1",
        "try r1.t2.c2 put 0 7 60",
        "ack r1.t2.c2",
        // A batch in flight: alpha/key00008 and beta/key00009.
        "try r1.t3.c0 batch 0 8 1 9 50",
        // alpha/key00010, which held an earlier run's value: deleted.
        "try r1.t4.c0 del 0 10",
        "ack r1.t4.c0",
        "hash 1 0 5 0 2",
        // gamma/key00011: a put, then a read-modify-write after it.
        "try r1.t5.c0 put 2 11 40",
        "ack r1.t5.c0",
        "try r1.t5.c1 rmw 11 45",
        "ack r1.t5.c1",
        // A batch in flight: gamma/key00013 and beta/key00012.
        "try r1.t6.c0 batch 2 13 1 12 55",
    ]
    .map(String::from);
    let log = RunLog::parse(1, &reports).expect("the reports parse");
    assert_eq!(
        log.hash,
        HashCounts {
            hot_cold_compactions: 1,
            cold_cold_compactions: 0,
            records_copied: 5,
            throttled_writes: 0,
            hot_disk_reads: 2,
        }
    );
    let earlier = WriteId {
        run: 0,
        thread: 0,
        counter: 0,
    };
    let k = |ks: usize, slot: u64| (ks, key_of(slot));
    let model = Model {
        values: BTreeMap::from([(k(0, 10), value_of(earlier, 50))]),
        touched: BTreeSet::from([k(0, 10)]),
    };
    let good: Found = BTreeMap::from([
        (k(0, 5), Some(value_of(w(0, 0), 100))),
        (k(1, 6), Some(value_of(w(1, 0), 80))),
        (k(0, 7), Some(value_of(w(2, 2), 60))),
        (k(0, 8), None),
        (k(1, 9), None),
        (k(0, 10), None),
        (k(2, 11), Some(value_of(w(5, 1), 45))),
        (k(1, 12), None),
        (k(2, 13), None),
    ]);
    let check = |changes: &[(Key, Option<Vec<u8>>)]| {
        let mut found = good.clone();
        found.extend(changes.iter().cloned());
        check_run(&model, &log, &found).0
    };
    let (violations, counts) = check_run(&model, &log, &good);
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(
        (
            counts.acked_puts,
            counts.acked_deletes,
            counts.acked_rmws,
            counts.acked_batches,
            counts.acked_hash,
        ),
        (6, 1, 1, 0, 2)
    );
    assert_eq!((counts.in_flight, counts.in_flight_kept), (3, 0));

    // Right: the in-flight write, the other overlapping one, each whole batch.
    let batch = Some(value_of(w(3, 0), 50));
    let hash_batch = Some(value_of(w(6, 0), 55));
    for right in [
        vec![(k(0, 5), Some(value_of(w(0, 1), 90)))],
        vec![(k(1, 6), Some(value_of(w(2, 0), 70)))],
        vec![(k(0, 8), batch.clone()), (k(1, 9), batch.clone())],
        vec![
            (k(2, 13), hash_batch.clone()),
            (k(1, 12), hash_batch.clone()),
        ],
    ] {
        let violations = check(&right);
        assert!(violations.is_empty(), "{right:?}: {violations:?}");
    }

    let kept = check_run(&model, &log, &{
        let mut found = good.clone();
        found.insert(k(0, 5), Some(value_of(w(0, 1), 90)));
        found
    });
    assert_eq!((kept.1.in_flight, kept.1.in_flight_kept), (3, 1));

    // Wrong.
    let lost = |v: &[Violation]| matches!(v, [Violation::Lost { .. }]);
    let garbage = |v: &[Violation]| matches!(v, [Violation::Garbage { .. }]);
    let half = |v: &[Violation]| matches!(v, [Violation::HalfBatch { .. }]);
    type Expect = fn(&[Violation]) -> bool;
    type Changes = Vec<(Key, Option<Vec<u8>>)>;
    let wrong: [(Changes, Expect); 13] = [
        // An acknowledged put gone.
        (vec![(k(0, 5), None)], lost),
        // An acknowledged write's value, replaced by one acknowledged after it.
        (vec![(k(0, 7), Some(value_of(w(2, 1), 60)))], lost),
        // An acknowledged delete undone: the earlier run's value is back.
        (vec![(k(0, 10), Some(value_of(earlier, 50)))], lost),
        // A write's name with other bytes.
        (vec![(k(0, 5), Some(value_of(w(0, 0), 99)))], garbage),
        // A write never tried.
        (vec![(k(0, 5), Some(value_of(w(9, 9), 100)))], garbage),
        // A write of another key.
        (vec![(k(0, 5), Some(value_of(w(2, 2), 60)))], garbage),
        // Half a batch, either half.
        (vec![(k(0, 8), batch.clone())], half),
        (vec![(k(1, 9), batch.clone())], half),
        // The hash keyspace: an acknowledged read-modify-write undone, or gone.
        (vec![(k(2, 11), Some(value_of(w(5, 0), 40)))], lost),
        (vec![(k(2, 11), None)], lost),
        // Its value with other bytes.
        (vec![(k(2, 11), Some(value_of(w(5, 1), 44)))], garbage),
        // Half a batch of a tree and the hash keyspace, either half.
        (vec![(k(2, 13), hash_batch.clone())], half),
        (vec![(k(1, 12), hash_batch.clone())], half),
    ];
    for (changes, expect) in wrong {
        let violations = check(&changes);
        assert!(expect(&violations), "{changes:?}: {violations:?}");
    }
}
