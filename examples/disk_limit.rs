//! The disk's limit for small random reads (issue 35): reads per second at each read
//! size, queue depth and thread count, on a file of the work disk read with `O_DIRECT`
//! through io_uring, each thread keeping its window of reads in flight (a completed read
//! is replaced at once, not after its round). The larger-than-memory rows of
//! `docs/benchmarks.md` give their device reads per second as a fraction of this table.
//!
//! Run: `cargo run --release --example disk_limit -- [options]`
//!
//! ```text
//! --dir PATH        where the file goes (default target/disk_limit; must not be tmpfs)
//! --file-mib N      size of the file read (default 4096; written once, then reused)
//! --sizes LIST      read sizes in bytes (default 512,1024,4096)
//! --depths LIST     reads in flight per thread (default 1,4,16,32,64,128,256,512)
//! --threads LIST    thread counts (default 2,16)
//! --seconds S       seconds per row (default 3)
//! --small           CI mode: a 16 MiB file, 4 KiB reads at depths 1 and 8, 1 thread, 0.2 s
//! ```
//!
//! The file is filled with written bytes (a read of a never-written extent would be
//! answered without touching the device) and its pages are dropped from the page cache
//! first; `O_DIRECT` keeps them out. A size below the device's logical block size is
//! refused by the kernel (`EINVAL`), and its row says so.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, types};

/// Command-line options.
struct Options {
    dir: PathBuf,
    file_mib: u64,
    sizes: Vec<usize>,
    depths: Vec<usize>,
    threads: Vec<usize>,
    seconds: f64,
}

fn list(text: &str) -> Result<Vec<usize>, String> {
    text.split(',')
        .map(|n| n.parse().map_err(|e| format!("{n}: {e}")))
        .collect()
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        dir: PathBuf::from("target/disk_limit"),
        file_mib: 4096,
        sizes: vec![512, 1024, 4096],
        depths: vec![1, 4, 16, 32, 64, 128, 256, 512],
        threads: vec![2, 16],
        seconds: 3.0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--dir" => o.dir = PathBuf::from(value("--dir")?),
            "--file-mib" => {
                o.file_mib = value("--file-mib")?.parse().map_err(|e| format!("{e}"))?
            }
            "--sizes" => o.sizes = list(&value("--sizes")?)?,
            "--depths" => o.depths = list(&value("--depths")?)?,
            "--threads" => o.threads = list(&value("--threads")?)?,
            "--seconds" => o.seconds = value("--seconds")?.parse().map_err(|e| format!("{e}"))?,
            "--small" => {
                o.file_mib = 16;
                o.sizes = vec![4096];
                o.depths = vec![1, 8];
                o.threads = vec![1];
                o.seconds = 0.2;
            }
            other => return Err(format!("unknown option {other}; see the file's header")),
        }
    }
    if o.sizes
        .iter()
        .any(|&s| s == 0 || s > 1 << 20 || !s.is_power_of_two())
    {
        return Err("read sizes are powers of two of at most 1 MiB".to_string());
    }
    if o.depths.contains(&0) || o.threads.contains(&0) {
        return Err("depths and thread counts are at least 1".to_string());
    }
    Ok(o)
}

/// xorshift64*: a small deterministic generator, seeded per thread.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// Creates (or reuses, if it has the right size) a file of `bytes` written bytes, and
/// drops its pages from the page cache.
fn prepare_file(path: &Path, bytes: u64) -> std::io::Result<()> {
    if !std::fs::metadata(path).is_ok_and(|m| m.len() == bytes) {
        eprintln!("writing {} MiB to {} ...", bytes >> 20, path.display());
        let mut file = File::create(path)?;
        let mut rng = Rng(0x5eed);
        let chunk: Vec<u8> = (0..1 << 20).map(|_| rng.below(256) as u8).collect();
        for _ in 0..bytes >> 20 {
            file.write_all(&chunk)?;
        }
        file.sync_all()?;
    }
    let file = File::open(path)?;
    // SAFETY: the descriptor is open for the whole call; fadvise takes no pointers.
    let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        return Err(std::io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// A buffer of `len` bytes aligned to 4 KiB, as `O_DIRECT` needs.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("a valid layout");
        // SAFETY: the layout has a nonzero size (sizes are at least 1).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Aligned { ptr, layout }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// One thread's reads: `depth` random `size`-byte reads of `path` kept in flight until
/// `deadline`. Returns the reads completed, or the error of the first failed read.
fn reader(path: &Path, size: usize, depth: usize, seed: u64, secs: f64) -> std::io::Result<u64> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let fd = types::Fd(file.as_raw_fd());
    let slots = file.metadata()?.len() / size as u64;
    let mut ring = IoUring::new(depth.next_power_of_two() as u32)?;
    let buffers = Aligned::new(depth * size);
    let base = buffers.ptr;
    let mut rng = Rng(seed | 1);
    let mut push = |ring: &mut IoUring, i: usize| {
        let offset = rng.below(slots) * size as u64;
        // SAFETY: buffer `i` is the `i`th `size` bytes of `buffers`, which outlives the
        // ring (dropped first, below); it is in no other read until this one completes.
        let buf = unsafe { base.add(i * size) };
        let entry = opcode::Read::new(fd, buf, size as u32)
            .offset(offset)
            .build()
            .user_data(i as u64);
        // SAFETY: as above; at most `depth` reads are queued, the ring's size or less.
        unsafe { ring.submission().push(&entry) }.expect("the ring has room for the window");
    };
    for i in 0..depth {
        push(&mut ring, i);
    }
    let (start, mut done) = (Instant::now(), 0u64);
    let deadline = Duration::from_secs_f64(secs);
    // Every read is reaped before the buffers go, a failed one included: the first
    // failure stops the refills and is returned once the window has drained.
    let (mut in_flight, mut failed) = (depth, None);
    while in_flight > 0 {
        match ring.submit_and_wait(1) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // (Reads still in flight would land in freed buffers: leak them instead.)
            Err(e) => {
                std::mem::forget(buffers);
                return Err(e);
            }
            Ok(_) => {}
        }
        let completed: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (i, result) in completed {
            if result < 0 {
                failed.get_or_insert(std::io::Error::from_raw_os_error(-result));
            } else {
                done += 1;
            }
            if failed.is_none() && start.elapsed() < deadline {
                push(&mut ring, i);
            } else {
                in_flight -= 1;
            }
        }
    }
    drop(ring);
    failed.map_or(Ok(done), Err)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = parse_args()?;
    std::fs::create_dir_all(&o.dir)?;
    let path = o.dir.join("reads.bin");
    prepare_file(&path, o.file_mib << 20)?;
    println!(
        "random O_DIRECT reads of {} MiB at {} on io_uring, each thread's window kept full, \
         {} s per row",
        o.file_mib,
        o.dir.display(),
        o.seconds
    );
    println!(
        "{:>6} {:>8} {:>6} {:>10} {:>12} {:>9}",
        "size", "threads", "depth", "in flight", "reads/s", "MB/s"
    );
    for &size in &o.sizes {
        for &threads in &o.threads {
            for &depth in &o.depths {
                let start = Instant::now();
                let counts: Vec<std::io::Result<u64>> = std::thread::scope(|s| {
                    let handles: Vec<_> = (0..threads)
                        .map(|t| {
                            let path = &path;
                            let seed = (t as u64 + 1) * 0x9E37_79B9_7F4A_7C15;
                            s.spawn(move || reader(path, size, depth, seed, o.seconds))
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("a reader"))
                        .collect()
                });
                let secs = start.elapsed().as_secs_f64();
                let in_flight = threads * depth;
                match counts.into_iter().collect::<std::io::Result<Vec<u64>>>() {
                    Ok(counts) => {
                        let rate = counts.iter().sum::<u64>() as f64 / secs;
                        let mbs = rate * size as f64 / 1e6;
                        println!(
                            "{size:>6} {threads:>8} {depth:>6} {in_flight:>10} {rate:>12.0} \
                             {mbs:>9.1}"
                        );
                    }
                    Err(e) => println!("{size:>6} {threads:>8} {depth:>6} {in_flight:>10} {e}"),
                }
            }
        }
    }
    Ok(())
}
