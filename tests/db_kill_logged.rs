//! How much a crash takes of `Durability::Logged` writes under load: a measurement, not
//! a pass/fail test of a time (it is ignored by `cargo test`; its command is below).
//!
//! A child process opens a database with the default flush interval (5 ms) and writes
//! single logged puts from 16 threads on this machine's 2 cores, each thread to its own
//! key, the value its write counter. After every acknowledged write the thread records
//! the counter and the moment of the acknowledgement (`CLOCK_MONOTONIC`, which both
//! processes share) in a ring of its own in a shared memory file: a `MAP_SHARED` mapping
//! whose pages outlive the process. The parent kills the child with SIGKILL at a random
//! moment, noting the moment, reopens the database, and reads each thread's key: every
//! counter above the recovered one that the ring holds as acknowledged is a lost write,
//! and the kill moment minus its acknowledgement is how old it was. The `Logged` bound
//! says no lost write is much older than the flush interval.
//!
//! ```text
//! BFDB_KILLS=30 cargo test --release --test db_kill_logged -- --ignored --nocapture
//! ```

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bfdb::{Db, DbOptions};

const THREADS: usize = 16;
/// Acknowledgements each thread's ring keeps: far more than a flush interval's worth.
const RING: usize = 1 << 16;
const CHILD_DIR: &str = "BFDB_LOGGED_CHILD_DIR";
const CHILD_RINGS: &str = "BFDB_LOGGED_CHILD_RINGS";

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for both processes.
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes the `timespec` it is given and reads nothing else.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The shared rings: per thread, `RING` pairs of (counter, acknowledged at) as u64s.
struct Rings {
    ptr: *mut u64,
    len: usize,
}

// SAFETY: each thread writes only its own ring; the parent reads after the child died.
unsafe impl Send for Rings {}
// SAFETY: as above.
unsafe impl Sync for Rings {}

impl Rings {
    fn map(path: &Path, create: bool) -> Rings {
        let len = THREADS * RING * 2;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)
            .unwrap();
        if create {
            file.set_len((len * 8) as u64).unwrap();
        }
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of a file of exactly `len` u64s, kept until
        // the process ends.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len * 8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        Rings {
            ptr: ptr.cast(),
            len,
        }
    }

    fn slot(&self, thread: usize, counter: u64) -> usize {
        (thread * RING + (counter as usize % RING)) * 2
    }

    fn record(&self, thread: usize, counter: u64, at_ns: u64) {
        let i = self.slot(thread, counter);
        assert!(i + 1 < self.len);
        // SAFETY: in bounds (checked), and only this thread writes its ring.
        unsafe {
            self.ptr.add(i + 1).write_volatile(at_ns);
            self.ptr.add(i).write_volatile(counter);
        }
    }

    /// When `counter` of `thread` was acknowledged, if the ring still holds it.
    fn acked_at(&self, thread: usize, counter: u64) -> Option<u64> {
        let i = self.slot(thread, counter);
        // SAFETY: in bounds; the writer is dead.
        let (c, at) = unsafe {
            (
                self.ptr.add(i).read_volatile(),
                self.ptr.add(i + 1).read_volatile(),
            )
        };
        (c == counter && at != 0).then_some(at)
    }
}

fn options() -> DbOptions {
    DbOptions::default()
}

fn thread_key(t: usize) -> Vec<u8> {
    format!("thread{t:02}").into_bytes()
}

/// The child: writes until it is killed.
#[test]
#[ignore = "the child process of logged_writes_lost_to_a_kill"]
fn logged_child_entry() {
    let (Ok(dir), Ok(rings)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_RINGS)) else {
        return;
    };
    let db = Db::open(&dir, options()).unwrap();
    let tree = db.tree("t").unwrap();
    let rings = Arc::new(Rings::map(Path::new(&rings), false));
    let start: Vec<u64> = (0..THREADS)
        .map(|t| {
            tree.get(&thread_key(t))
                .unwrap()
                .map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap()))
        })
        .collect();
    println!("ready");
    std::thread::scope(|s| {
        for (t, &from) in start.iter().enumerate() {
            let (tree, rings) = (&tree, &rings);
            s.spawn(move || {
                let mut counter = from;
                let mut value = [0u8; 100];
                loop {
                    counter += 1;
                    value[..8].copy_from_slice(&counter.to_le_bytes());
                    tree.insert(&thread_key(t), &value[..8]).unwrap();
                    rings.record(t, counter, now_ns());
                }
            });
        }
    });
}

/// The measurement (see the module docs).
#[test]
#[ignore = "a measurement: BFDB_KILLS=30 cargo test --release --test db_kill_logged -- --ignored --nocapture"]
fn logged_writes_lost_to_a_kill() {
    let kills: u64 = std::env::var("BFDB_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let dir = tempfile::tempdir().unwrap();
    let rings_path = dir.path().join("rings");
    let db_dir = dir.path().join("db");
    let mut ages_ms: Vec<f64> = Vec::new();
    let mut lost_total = 0u64;
    let mut seed = now_ns() | 1;
    for kill in 0..kills {
        let rings = Rings::map(&rings_path, true);
        // SAFETY: a fresh mapping of a file this process owns; no child runs yet.
        unsafe { std::ptr::write_bytes(rings.ptr, 0, rings.len) };
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args(["logged_child_entry", "--exact", "--ignored", "--nocapture"])
            .env(CHILD_DIR, &db_dir)
            .env(CHILD_RINGS, &rings_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut ready = [0u8; 64];
        let mut seen = String::new();
        while !seen.contains("ready") {
            let n = out.read(&mut ready).unwrap();
            assert!(n > 0, "the child ended before it was ready");
            seen.push_str(&String::from_utf8_lossy(&ready[..n]));
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(300 + seed % 1200));
        let killed_at = now_ns();
        // SAFETY: sending a signal to a child this process started.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        let db = Db::open(&db_dir, options()).unwrap();
        let tree = db.tree("t").unwrap();
        let (mut lost, mut oldest_ms) = (0u64, 0f64);
        for t in 0..THREADS {
            let recovered = tree
                .get(&thread_key(t))
                .unwrap()
                .map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap()));
            let mut c = recovered + 1;
            while let Some(at) = rings.acked_at(t, c) {
                let age_ms = killed_at.saturating_sub(at) as f64 / 1e6;
                ages_ms.push(age_ms);
                oldest_ms = oldest_ms.max(age_ms);
                lost += 1;
                c += 1;
            }
        }
        let written: u64 = (0..THREADS)
            .map(|t| {
                tree.get(&thread_key(t))
                    .unwrap()
                    .map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap()))
            })
            .sum();
        lost_total += lost;
        eprintln!(
            "kill {kill}: {lost} acknowledged logged writes lost, the oldest acknowledged \
             {oldest_ms:.2} ms before the kill ({written} writes recovered in all)"
        );
        drop(tree);
        db.close().unwrap();
    }
    ages_ms.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        ages_ms
            .get(((ages_ms.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    eprintln!(
        "{kills} kills: {lost_total} acknowledged logged writes lost; their age at the kill: \
         median {:.2} ms, p99 {:.2} ms, max {:.2} ms (flush interval 5 ms)",
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
}
