//! Page IO benchmark (issue 5): 4 KiB random-read IOPS of each IO engine over a file of
//! pages, and the Tree's `get` throughput on a file ten times its memory budget with each
//! backend.
//!
//! Run: `cargo run --release --example iops -- [options]`
//!
//! ```text
//! --small            CI mode: 64 MiB file, 4 MiB budget, 1 s per measurement
//! --seconds N        seconds per measurement (default 5)
//! --file-mib N       size of the IOPS file (default 1024)
//! --budget-mib N     memory budget of the trees (default 32; the trees hold 10x)
//! --threads N        thread count of the multi-threaded Tree rows (default 8)
//! --dir PATH         where the files go (default target/iops; must not be tmpfs)
//! --backends LIST    Tree backends in the order to run them, comma-separated, from
//!                    std, std-direct, io_uring (default: all three in that order)
//! --skip-iops        only the Tree rows
//! --skip-tree        only the IOPS rows
//! ```
//!
//! The IOPS rows read through a [`FileStore`], so each read also verifies the page's
//! CRC-32C, as every read in bfdb does. The raw rows drive a ring directly, without
//! the store, to compare reading into the caller's page with reading into registered
//! buffers and copying out (the choice recorded in the io_uring section of `docs/design.md`).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bfdb::storage::{FileOptions, FileStore, IoEngine, PAGE_SIZE, Page, PageNo, PageStore};
use bfdb::{Backend, Config, Tree};

/// Command-line options.
struct Options {
    seconds: f64,
    file_mib: u64,
    budget_mib: u64,
    threads: usize,
    dir: PathBuf,
    iops: bool,
    tree: bool,
    backends: Vec<Backend>,
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        seconds: 5.0,
        file_mib: 1024,
        budget_mib: 32,
        threads: 8,
        dir: PathBuf::from("target/iops"),
        iops: true,
        tree: true,
        backends: vec![Backend::Std, Backend::StdDirect, Backend::IoUring],
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--small" => {
                o.seconds = 1.0;
                o.file_mib = 64;
                o.budget_mib = 4;
                o.threads = 4;
            }
            "--seconds" => o.seconds = value("--seconds")?.parse().map_err(|e| format!("{e}"))?,
            "--file-mib" => {
                o.file_mib = value("--file-mib")?.parse().map_err(|e| format!("{e}"))?
            }
            "--budget-mib" => {
                o.budget_mib = value("--budget-mib")?.parse().map_err(|e| format!("{e}"))?
            }
            "--threads" => o.threads = value("--threads")?.parse().map_err(|e| format!("{e}"))?,
            "--dir" => o.dir = PathBuf::from(value("--dir")?),
            "--backends" => {
                o.backends = value("--backends")?
                    .split(',')
                    .map(|b| match b {
                        "std" => Ok(Backend::Std),
                        "std-direct" => Ok(Backend::StdDirect),
                        "io_uring" => Ok(Backend::IoUring),
                        other => Err(format!("unknown backend {other}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--skip-iops" => o.iops = false,
            "--skip-tree" => o.tree = false,
            other => return Err(format!("unknown option {other}; see the file's header")),
        }
    }
    Ok(o)
}

/// xorshift64*: a small deterministic generator, seeded per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The first data slot of a page-store file (slots 0 and 1 are its superblocks).
const FIRST_PAGE: u64 = 2;

/// Creates (or reuses, if it has the right size) a store file of `pages` data pages.
fn prepare_file(path: &Path, pages: u64) -> Result<(), Box<dyn std::error::Error>> {
    let want_bytes = (pages + FIRST_PAGE) * PAGE_SIZE as u64;
    if std::fs::metadata(path).is_ok_and(|m| m.len() == want_bytes) {
        return Ok(());
    }
    let _ = std::fs::remove_file(path);
    eprintln!(
        "writing {} MiB of pages to {} ...",
        want_bytes >> 20,
        path.display()
    );
    let options = FileOptions::new()
        .direct_io(true)
        .io_engine(IoEngine::IoUring);
    let store = FileStore::open(path, options)?;
    let mut pages_buf: Vec<Box<Page>> = (0..128).map(|_| Page::boxed()).collect();
    let mut next = 0u64;
    while next < pages {
        let n = (pages - next).min(pages_buf.len() as u64) as usize;
        let mut reqs = Vec::with_capacity(n);
        for page in pages_buf.iter_mut().take(n) {
            let no = store.allocate()?;
            page.payload_mut()[..8].copy_from_slice(&no.0.to_le_bytes());
            reqs.push((no, &mut **page));
        }
        store.write_pages(&mut reqs)?;
        next += n as u64;
    }
    store.sync()?;
    Ok(())
}

/// Drops the file's pages from the OS page cache.
fn drop_cache(path: &Path) -> std::io::Result<()> {
    let file = File::open(path)?;
    file.sync_all()?;
    // SAFETY: the descriptor is open for the whole call; fadvise takes no pointers.
    let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        return Err(std::io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Random 4 KiB reads of `batch` pages at a time through `store` for `secs` seconds,
/// single thread. Returns reads per second.
fn store_iops(store: &FileStore, pages: u64, batch: usize, secs: f64) -> f64 {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut bufs: Vec<Box<Page>> = (0..batch).map(|_| Page::boxed()).collect();
    let deadline = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut reads = 0u64;
    while start.elapsed() < deadline {
        if batch == 1 {
            let no = PageNo(FIRST_PAGE + rng.below(pages));
            store.read_page(no, &mut bufs[0]).expect("read");
        } else {
            let mut reqs: Vec<(PageNo, &mut Page)> = bufs
                .iter_mut()
                .map(|p| (PageNo(FIRST_PAGE + rng.below(pages)), &mut **p))
                .collect();
            store.read_pages(&mut reqs).expect("read_pages");
        }
        reads += batch as u64;
    }
    reads as f64 / start.elapsed().as_secs_f64()
}

/// Random 4 KiB page IO of `batch` pages at a time through `store` for `secs` seconds,
/// single thread: `reads` and `writes` batches in turn (a merge reads its leaf pages, then
/// writes them back). Returns (reads, writes) per second. Writes overwrite pages of the
/// file, so the file does not grow.
fn store_mixed_iops(
    store: &FileStore,
    pages: u64,
    batch: usize,
    (reads, writes): (usize, usize),
    secs: f64,
) -> (f64, f64) {
    let mut rng = Rng(0x0fed_cba9_8765_4321);
    let mut bufs: Vec<Box<Page>> = (0..batch).map(|_| Page::boxed()).collect();
    let deadline = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let (mut read, mut written) = (0u64, 0u64);
    while start.elapsed() < deadline {
        for (count, write) in [(reads, false), (writes, true)] {
            for _ in 0..count {
                let mut reqs: Vec<(PageNo, &mut Page)> = bufs
                    .iter_mut()
                    .map(|p| (PageNo(FIRST_PAGE + rng.below(pages)), &mut **p))
                    .collect();
                if write {
                    store.write_pages(&mut reqs).expect("write_pages");
                    written += batch as u64;
                } else {
                    store.read_pages(&mut reqs).expect("read_pages");
                    read += batch as u64;
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    (read as f64 / secs, written as f64 / secs)
}

/// Random 4 KiB `O_DIRECT` reads on a bare ring at queue depth `depth`, `secs` seconds:
/// into the caller's pages, or into registered buffers copied out to the caller's pages.
fn raw_ring_iops(
    path: &Path,
    pages: u64,
    depth: usize,
    registered: bool,
    secs: f64,
) -> Result<f64, Box<dyn std::error::Error>> {
    use io_uring::{IoUring, opcode, types};
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let fd = types::Fd(file.as_raw_fd());
    let mut ring = IoUring::new(depth.next_power_of_two() as u32)?;
    let mut dest: Vec<Box<Page>> = (0..depth).map(|_| Page::boxed()).collect();
    let mut fixed: Vec<Box<Page>> = (0..depth).map(|_| Page::boxed()).collect();
    if registered {
        let iovecs: Vec<libc::iovec> = fixed
            .iter_mut()
            .map(|p| libc::iovec {
                iov_base: p.as_bytes_mut().as_mut_ptr().cast(),
                iov_len: PAGE_SIZE,
            })
            .collect();
        // SAFETY: the registered pages live in `fixed`, which outlives the ring's use of
        // them: the ring is dropped (unregistering them) at the end of this function,
        // before `fixed`, and no completion is left unreaped.
        unsafe { ring.submitter().register_buffers(&iovecs)? };
    }
    let mut rng = Rng(0xfeed_f00d_dead_beef);
    let deadline = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut reads = 0u64;
    while start.elapsed() < deadline {
        for i in 0..depth {
            let offset = (FIRST_PAGE + rng.below(pages)) * PAGE_SIZE as u64;
            let entry = if registered {
                let buf = fixed[i].as_bytes_mut().as_mut_ptr();
                opcode::ReadFixed::new(fd, buf, PAGE_SIZE as u32, i as u16)
                    .offset(offset)
                    .build()
            } else {
                let buf = dest[i].as_bytes_mut().as_mut_ptr();
                opcode::Read::new(fd, buf, PAGE_SIZE as u32)
                    .offset(offset)
                    .build()
            };
            // SAFETY: each entry's buffer is a distinct page of `dest` or `fixed`, not
            // touched until the entry's completion is reaped below, before the next
            // round reuses it; the ring has `depth` entries, so pushing cannot overflow.
            unsafe { ring.submission().push(&entry.user_data(i as u64)) }
                .map_err(|_| "submission queue full")?;
        }
        let mut left = depth;
        while left > 0 {
            ring.submit_and_wait(left)?;
            for cqe in ring.completion() {
                if cqe.result() != PAGE_SIZE as i32 {
                    return Err(format!("raw read returned {}", cqe.result()).into());
                }
                if registered {
                    let i = cqe.user_data() as usize;
                    dest[i].as_bytes_mut().copy_from_slice(fixed[i].as_bytes());
                }
                left -= 1;
            }
        }
        reads += depth as u64;
    }
    drop(ring);
    Ok(reads as f64 / start.elapsed().as_secs_f64())
}

fn iops_rows(o: &Options) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(&o.dir)?;
    let path = o.dir.join("iops.bfdb");
    let pages = o.file_mib * 256;
    prepare_file(&path, pages)?;
    println!(
        "\n4 KiB random reads, one thread, {} MiB file, {:.0} s each",
        o.file_mib, o.seconds
    );
    println!("{:<48} {:>12}", "engine", "reads/s");
    let row = |name: &str, v: f64| println!("{name:<48} {v:>12.0}");

    for random_advice in [false, true] {
        drop_cache(&path)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)?;
        if random_advice {
            // No readahead: every miss reads one page, as O_DIRECT does.
            // SAFETY: the descriptor is open for the whole call; fadvise takes no
            // pointers.
            let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
            if r != 0 {
                return Err(std::io::Error::from_raw_os_error(r).into());
            }
        }
        let buffered = FileStore::from_file(file, FileOptions::new().create(false))?;
        let name = if random_advice {
            "pread, buffered, FADV_RANDOM (cache dropped)"
        } else {
            "pread, buffered (cache dropped first)"
        };
        row(name, store_iops(&buffered, pages, 1, o.seconds));
    }
    drop_cache(&path)?;

    let direct = FileStore::open(&path, FileOptions::new().create(false).direct_io(true))?;
    assert!(direct.direct_io_active(), "the IOPS file needs O_DIRECT");
    row("pread, O_DIRECT", store_iops(&direct, pages, 1, o.seconds));
    drop(direct);

    let uring = FileStore::open(
        &path,
        FileOptions::new()
            .create(false)
            .direct_io(true)
            .io_engine(IoEngine::IoUring),
    )?;
    for batch in [1, 8, 32, 128] {
        let name = if batch == 1 {
            "io_uring, O_DIRECT, read_page (depth 1)".to_string()
        } else {
            format!("io_uring, O_DIRECT, read_pages batch {batch}")
        };
        row(&name, store_iops(&uring, pages, batch, o.seconds));
    }
    // Writes, and reads and writes in turn, as the tree's merges issue them.
    for (what, mix) in [("writes only", (0, 1)), ("reads, writes in turn", (1, 1))] {
        let (r, w) = store_mixed_iops(&uring, pages, 32, mix, o.seconds);
        println!(
            "{:<48} {r:>12.0} reads/s + {w:.0} writes/s",
            format!("io_uring, O_DIRECT, batch 32, {what}")
        );
    }
    drop(uring);
    for (depth, registered) in [(1, false), (32, false), (32, true)] {
        let name = if registered {
            format!("raw ring depth {depth}, registered buffers + copy")
        } else {
            format!("raw ring depth {depth}, into the caller's pages")
        };
        row(
            &name,
            raw_ring_iops(&path, pages, depth, registered, o.seconds)?,
        );
    }
    Ok(())
}

fn tree_key(i: u64) -> [u8; 16] {
    let mut k = *b"key-000000000000";
    let digits = format!("{i:012}");
    k[4..].copy_from_slice(digits.as_bytes());
    k
}

/// Loads a tree ten times its budget on `backend`, then measures random `get`s with
/// one and with `o.threads` threads. Returns (name, load s, gets/s 1 thread, gets/s N).
fn tree_row(
    o: &Options,
    backend: Backend,
) -> Result<(String, f64, f64, f64), Box<dyn std::error::Error>> {
    let path = o.dir.join(format!("tree-{backend:?}.bfdb"));
    let _ = std::fs::remove_file(&path);
    let budget_bytes = o.budget_mib << 20;
    let config = Config {
        memory_budget_bytes: budget_bytes,
        backend,
        ..Config::default()
    };
    const VALUE_BYTES: usize = 100;
    let records = 10 * budget_bytes / (16 + VALUE_BYTES as u64);
    let tree = Tree::open(&path, config)?;
    let start = Instant::now();
    let mut value = [0u8; VALUE_BYTES];
    // Ascending keys: each leaf page is filled once, as a bulk load would.
    for i in 0..records {
        value[..8].copy_from_slice(&i.to_le_bytes());
        tree.insert(&tree_key(i), &value)?;
    }
    tree.flush()?;
    let load_secs = start.elapsed().as_secs_f64();
    let stats = tree.stats();
    let name = format!(
        "{backend:?} ({}{})",
        stats.backend,
        if stats.direct_io { ", O_DIRECT" } else { "" }
    );
    if let Some(notice) = &stats.backend_notice {
        eprintln!("{name}: {notice}");
    }
    if !stats.direct_io {
        // Buffered reads should start cold, like the O_DIRECT ones.
        drop_cache(&path)?;
    }
    let measure = |threads: usize| -> f64 {
        let deadline = Duration::from_secs_f64(o.seconds);
        let start = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let tree = &tree;
                    s.spawn(move || {
                        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));
                        let mut out = Vec::new();
                        let mut gets = 0u64;
                        while start.elapsed() < deadline {
                            for _ in 0..64 {
                                let i = rng.below(records);
                                let found = tree.get_into(&tree_key(i), &mut out).expect("get");
                                assert!(found && out[..8] == i.to_le_bytes(), "key {i}");
                            }
                            gets += 64;
                        }
                        gets
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).sum()
        });
        total as f64 / start.elapsed().as_secs_f64()
    };
    let one = measure(1);
    let many = measure(o.threads);
    drop(tree);
    let _ = std::fs::remove_file(&path);
    Ok((name, load_secs, one, many))
}

fn tree_rows(o: &Options) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(&o.dir)?;
    println!(
        "\nTree get, uniform random keys, {} MiB budget, ~{} MiB of records, {:.0} s each",
        o.budget_mib,
        10 * o.budget_mib,
        o.seconds
    );
    println!(
        "{:<32} {:>10} {:>14} {:>14}",
        "backend",
        "load s",
        "gets/s 1 thr",
        format!("gets/s {} thr", o.threads)
    );
    for &backend in &o.backends {
        let (name, load, one, many) = tree_row(o, backend)?;
        println!("{name:<32} {load:>10.1} {one:>14.0} {many:>14.0}");
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = parse_args()?;
    if o.iops {
        iops_rows(&o)?;
    }
    if o.tree {
        tree_rows(&o)?;
    }
    Ok(())
}
