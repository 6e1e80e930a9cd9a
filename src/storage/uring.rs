//! Page IO on io_uring: one ring per thread, batches submitted in one system call.
//!
//! [`FileStore`](super::FileStore) keeps the file format (superblocks, free list,
//! poisoning, `flock`) in one place; with [`IoEngine::IoUring`](super::IoEngine) it hands
//! its *data-page* reads and writes to `submit_pages` here instead of `pread`/`pwrite`.
//! Superblock and free-list IO stay on `pread`/`pwrite`: they happen once per sync and
//! gain nothing from a ring.
//!
//! # Rings
//!
//! Every thread owns its rings in a `thread_local!`, created on first use and closed
//! when the thread exits: one plain ring, only if some store asks for it one SQPOLL
//! ring, and one for the thread's read windows (`storage/window.rs`). A ring is never
//! shared between threads, so no lock or `RefCell` guards it, and any number of threads
//! can do IO at once (a fixed pool of shared rings fails when threads outnumber it).
//! The ring is *taken out* of its thread-local slot for the duration of a batch and put
//! back afterwards; a re-entrant use on the same thread (which bfdb never does) would
//! build a second ring instead of failing.
//!
//! One ring serves every store a thread touches, so each submission entry carries its
//! store's file descriptor. Registered files are not used: a registration lives in a
//! ring, and a store cannot reach the rings of other threads to unregister its file
//! when it is dropped. The stale registration would keep the file open, and with it
//! the `flock` that refuses a second store on the same file.
//!
//! Registered buffers are not used either: pages come from the caller (`&mut Page`,
//! 4 KiB aligned), and a registered buffer would need a copy in or out of a ring-owned
//! buffer on every IO. Without registration, the kernel pins the caller's page for the
//! duration of each `O_DIRECT` IO, which costs less than a 4 KiB copy (see
//! the io_uring section of `docs/design.md` for the measurement).
//!
//! # Invariants this module owns
//!
//! - A buffer handed to the kernel is neither freed, moved nor reused before its
//!   completion has been reaped: `submit_pages` holds the `&mut Page` borrows of the
//!   whole batch and returns only when every submitted entry has completed, on error
//!   paths too.
//! - A ring goes back to its thread-local slot only if it holds no queued and no
//!   unreaped entries. A ring left in any other state (after an unexpected error of
//!   `io_uring_enter`) is drained of every entry the kernel took, then closed.
//! - Every negative completion becomes an `io::Error`; `EAGAIN` and `EINTR` are retried
//!   a bounded number of times; short transfers are continued from where they stopped;
//!   a read that reaches the end of the file is an [`io::ErrorKind::UnexpectedEof`] error.

use std::cell::Cell;
use std::io;
use std::os::fd::RawFd;

use io_uring::{IoUring, opcode, squeue, types};

use super::{PAGE_SIZE, Page, PageNo};

/// Submission-queue entries of a ring: the most IOs one thread keeps in flight. Larger
/// batches are split into rounds of this many.
pub const RING_ENTRIES: u32 = 128;

/// How long an idle SQPOLL kernel thread keeps polling before it sleeps.
const SQPOLL_IDLE_MS: u32 = 50;

/// `IORING_ENTER_GETEVENTS` of the kernel ABI: wait for completions.
const ENTER_GETEVENTS: u32 = 1;

/// How often one request is retried after `EAGAIN` or `EINTR` before its error is
/// returned.
pub(super) const MAX_RETRIES: u32 = 64;

/// Which way a batch moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// File to page.
    Read,
    /// Page to file.
    Write,
}

thread_local! {
    /// This thread's plain ring (index 0), SQPOLL ring (index 1) and read window's ring
    /// (index 2, [`super::window`]), built lazily.
    static RINGS: [Cell<Option<IoUring>>; 3] =
        const { [Cell::new(None), Cell::new(None), Cell::new(None)] };

    /// Set by [`simulate_io_uring_disabled_for_test`]: ring setup fails on this thread.
    static SIMULATE_DISABLED: Cell<bool> = const { Cell::new(false) };
}

/// Makes io_uring unavailable to the calling thread, as if the kernel refused it (for
/// tests of the backend choice). Affects [`probe`] and rings built afterwards; rings
/// this thread already built keep working.
#[doc(hidden)]
pub fn simulate_io_uring_disabled_for_test(disabled: bool) {
    SIMULATE_DISABLED.with(|d| d.set(disabled));
}

/// Builds a ring; SQPOLL if asked.
fn new_ring(sqpoll: bool) -> io::Result<IoUring> {
    if SIMULATE_DISABLED.with(Cell::get) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "io_uring is disabled on this thread by a test hook",
        ));
    }
    // Flags newer kernels know, most wanted first; a kernel that does not know one
    // refuses the ring with EINVAL and the next set is tried.
    //
    // - SUBMIT_ALL (5.18): the kernel keeps consuming a batch after one entry fails to
    //   prepare, instead of leaving the rest queued (the loop below resubmits what is
    //   left on older kernels).
    // - SINGLE_ISSUER (6.0) + DEFER_TASKRUN (6.1): only this thread uses the ring (it is
    //   thread-local), and completions are processed when this thread waits for them in
    //   `io_uring_enter`, not by interrupting it; that is exactly how batches wait.
    //   SQPOLL rings cannot defer task work.
    let mut sets: Vec<IoUringBuilder> = Vec::with_capacity(3);
    let mut plain = IoUring::builder();
    if sqpoll {
        plain.setup_sqpoll(SQPOLL_IDLE_MS);
    }
    let mut submit_all = plain.clone();
    submit_all.setup_submit_all();
    if !sqpoll {
        let mut deferred = submit_all.clone();
        deferred.setup_single_issuer().setup_defer_taskrun();
        sets.push(deferred);
    }
    sets.push(submit_all);
    sets.push(plain);
    let mut last_error = None;
    for builder in sets {
        match builder.build(RING_ENTRIES) {
            Ok(ring) => return Ok(ring),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last_error = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_error.expect("at least one flag set was tried"))
}

/// The builder of the `io-uring` crate for the default entry sizes.
type IoUringBuilder = io_uring::Builder<squeue::Entry, io_uring::cqueue::Entry>;

/// Checks that io_uring works for the calling thread: the kernel switch, ring setup,
/// and one no-op round trip. Leaves the thread's plain ring built.
///
/// # Errors
///
/// [`io::ErrorKind::Unsupported`] with the reason when `kernel.io_uring_disabled` is 2,
/// or the OS error of ring setup (`ENOSYS` on old kernels or under seccomp, `EPERM`
/// when restricted to a group) or of the no-op.
pub fn probe() -> io::Result<()> {
    probe_ring(false)
}

/// [`probe`] for the plain ring, or for the SQPOLL ring if `sqpoll`.
pub(crate) fn probe_ring(sqpoll: bool) -> io::Result<()> {
    // The hook also covers a thread whose ring already exists.
    if SIMULATE_DISABLED.with(Cell::get) {
        return new_ring(sqpoll).map(drop);
    }
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        && s.trim() == "2"
    {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "io_uring is disabled system-wide (kernel.io_uring_disabled = 2)",
        ));
    }
    with_ring(sqpoll, |ring| {
        let nop = opcode::Nop::new().build().user_data(u64::MAX);
        // SAFETY: a no-op entry points at no memory.
        if unsafe { ring.submission().push(&nop) }.is_err() {
            let e = io::Error::other("a clean ring has no room for one entry");
            return (Err(e), RingState::Unknown);
        }
        let mut reaped = None;
        while reaped.is_none() {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return (Err(e), RingState::Unknown),
            }
            reaped = ring.completion().next().map(|c| c.result());
        }
        let res = reaped.expect("loop ends with a completion");
        if res < 0 {
            return (Err(io::Error::from_raw_os_error(-res)), RingState::Clean);
        }
        (Ok(()), RingState::Clean)
    })?
}

/// What a batch leaves behind in the ring it used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RingState {
    /// No queued and no unreaped entries: the ring can serve the next batch.
    Clean,
    /// The ring may hold queued entries; close it.
    Unknown,
}

/// Runs `f` with this thread's ring of the given kind, building it if needed. The ring
/// goes back to its slot only if `f` leaves it clean.
fn with_ring<T>(sqpoll: bool, f: impl FnOnce(&mut IoUring) -> (T, RingState)) -> io::Result<T> {
    let slot = usize::from(sqpoll);
    // `try_with` fails only while the thread's locals are being destroyed (IO from
    // another thread-local's destructor); such a late call gets a ring of its own.
    let cached = RINGS.try_with(|r| r[slot].take()).ok().flatten();
    let mut ring = match cached {
        Some(ring) => ring,
        None => new_ring(sqpoll)?,
    };
    let (out, state) = f(&mut ring);
    if state == RingState::Clean {
        // A ring built by a re-entrant call may already sit in the slot; keep one.
        let _ = RINGS.try_with(|r| {
            let previous = r[slot].replace(Some(ring));
            drop(previous);
        });
    }
    Ok(out)
}

/// The slot of the read window's ring in [`RINGS`].
const WINDOW_SLOT: usize = 2;

/// This thread's read-window ring, taken out of its slot (built if there is none), or
/// `None` if io_uring cannot be had here.
pub(super) fn take_window_ring() -> Option<IoUring> {
    match RINGS.try_with(|r| r[WINDOW_SLOT].take()).ok().flatten() {
        Some(ring) => Some(ring),
        None => new_ring(false).ok(),
    }
}

/// Puts a clean read-window ring back in its slot for the thread's next window.
pub(super) fn put_window_ring(ring: IoUring) {
    let _ = RINGS.try_with(|r| {
        let previous = r[WINDOW_SLOT].replace(Some(ring));
        drop(previous);
    });
}

/// Progress of one request of a batch.
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    /// Bytes transferred so far.
    done_bytes: usize,
    /// `EAGAIN`/`EINTR` completions seen.
    retries: u32,
}

/// Reads or writes every page of `pages` at its slot (byte offset `no * PAGE_SIZE`,
/// the layout of the page-store files) of the file `fd`, on this thread's ring, in as
/// few `io_uring_enter` calls as the ring size allows: one for a batch of up to
/// [`RING_ENTRIES`] pages that all complete at once.
///
/// Every request runs to completion or failure before this returns. On failure the
/// error is that of the lowest-indexed failed request, returned with its index; the
/// other pages were transferred or not, each as a whole or in part.
///
/// Writes transfer the bytes as they are: the caller stamps the header first. Reads do
/// not verify what they read: the caller does.
pub(crate) fn submit_pages(
    fd: RawFd,
    dir: Direction,
    sqpoll: bool,
    pages: &mut [(PageNo, &mut Page)],
) -> Result<(), (usize, io::Error)> {
    if pages.is_empty() {
        return Ok(());
    }
    let mut requests = Vec::with_capacity(pages.len());
    for (i, (no, page)) in pages.iter_mut().enumerate() {
        let Some(offset) = no.0.checked_mul(PAGE_SIZE as u64) else {
            let e = io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("page {no} lies beyond any file offset"),
            );
            return Err((i, e));
        };
        // A raw pointer to the page, taken once: from here until every completion is
        // reaped, nothing touches `pages` except through these.
        let bytes = page.as_bytes_mut();
        requests.push(Request {
            fd,
            offset,
            base: bytes.as_mut_ptr(),
            len: bytes.len(),
        });
    }
    run_batch(dir, sqpoll, &requests)
}

/// One read of [`submit_reads`]: `buf.len()` bytes of file `fd` at byte `offset`.
pub(crate) struct ReadAt<'a> {
    /// The file.
    pub(crate) fd: RawFd,
    /// Where in the file.
    pub(crate) offset: u64,
    /// Where the bytes go; for an `O_DIRECT` file, aligned as the file needs.
    pub(crate) buf: &'a mut [u8],
}

/// Reads every request of `reads` — of any files, offsets and lengths — on this
/// thread's ring, as [`submit_pages`] does pages: every request has completed or failed
/// when this returns, and the error is that of the lowest-indexed failed request. A
/// read that reaches the end of its file is an [`io::ErrorKind::UnexpectedEof`] error.
pub(crate) fn submit_reads(
    sqpoll: bool,
    reads: &mut [ReadAt<'_>],
) -> Result<(), (usize, io::Error)> {
    let requests: Vec<Request> = reads
        .iter_mut()
        .map(|r| Request {
            fd: r.fd,
            offset: r.offset,
            base: r.buf.as_mut_ptr(),
            len: r.buf.len(),
        })
        .collect();
    run_batch(Direction::Read, sqpoll, &requests)
}

/// One write of [`submit_writes`]: `buf` to file `fd` at byte `offset`.
#[cfg_attr(
    feature = "shuttle",
    allow(dead_code, reason = "shuttle builds write synchronously")
)]
pub(crate) struct WriteAt<'a> {
    /// The file.
    pub(crate) fd: RawFd,
    /// Where in the file.
    pub(crate) offset: u64,
    /// The bytes; for an `O_DIRECT` file, aligned as the file needs.
    pub(crate) buf: &'a [u8],
}

/// Writes every request of `writes` — of any files, offsets and lengths — on this
/// thread's ring, as [`submit_reads`] reads: every request has completed or failed when
/// this returns, and the error is that of the lowest-indexed failed request.
#[cfg_attr(
    feature = "shuttle",
    allow(dead_code, reason = "shuttle builds write synchronously")
)]
pub(crate) fn submit_writes(
    sqpoll: bool,
    writes: &[WriteAt<'_>],
) -> Result<(), (usize, io::Error)> {
    let requests: Vec<Request> = writes
        .iter()
        .map(|w| Request {
            fd: w.fd,
            offset: w.offset,
            // A write only reads the buffer: the pointer is never written through.
            base: w.buf.as_ptr().cast_mut(),
            len: w.buf.len(),
        })
        .collect();
    run_batch(Direction::Write, sqpoll, &requests)
}

/// Runs `requests` on this thread's ring (built if needed).
fn run_batch(dir: Direction, sqpoll: bool, requests: &[Request]) -> Result<(), (usize, io::Error)> {
    if requests.is_empty() {
        return Ok(());
    }
    let batch = Batch { dir, requests };
    match with_ring(sqpoll, |ring| batch.run(ring)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(failure)) => Err(failure),
        // The ring could not be built: nothing was submitted.
        Err(e) => Err((0, e)),
    }
}

/// One transfer of a batch: `len` bytes between file `fd` at `offset` and the memory
/// at `base`, which the caller keeps borrowed (mutably) for the whole run.
struct Request {
    fd: RawFd,
    offset: u64,
    base: *mut u8,
    len: usize,
}

/// One batch of IO, described by raw pointers into buffers that the caller of
/// `submit_pages` or `submit_reads` keeps borrowed for the whole run.
struct Batch<'a> {
    dir: Direction,
    requests: &'a [Request],
}

impl Batch<'_> {
    /// The submission entry that continues request `i` after `done_bytes` bytes.
    fn entry(&self, i: usize, done_bytes: usize) -> squeue::Entry {
        let r = &self.requests[i];
        debug_assert!(done_bytes < r.len);
        // The pointer stays inside the buffer: `done_bytes < len`.
        let buf = r.base.wrapping_add(done_bytes);
        let len = (r.len - done_bytes) as u32;
        let offset = r.offset + done_bytes as u64;
        let fd = types::Fd(r.fd);
        let entry = match self.dir {
            Direction::Read => opcode::Read::new(fd, buf, len).offset(offset).build(),
            Direction::Write => opcode::Write::new(fd, buf, len).offset(offset).build(),
        };
        entry.user_data(i as u64)
    }

    /// Runs the batch to the end on `ring`.
    fn run(&self, ring: &mut IoUring) -> (Result<(), (usize, io::Error)>, RingState) {
        let n = self.requests.len();
        let capacity = ring.params().sq_entries() as usize;
        let mut progress = vec![Progress::default(); n];
        // Requests waiting to be (re)submitted, popped from the back; start with the
        // first request on top so a batch is submitted in order.
        let mut pending: Vec<usize> = (0..n).rev().collect();
        let mut first_error: Option<(usize, io::Error)> = None;
        // Entries pushed and not yet reaped, whether the kernel took them or not.
        let mut outstanding = 0usize;
        loop {
            {
                let mut sq = ring.submission();
                while outstanding < capacity {
                    let Some(i) = pending.pop() else { break };
                    let entry = self.entry(i, progress[i].done_bytes);
                    // SAFETY: the entry points into buffer `i`, which the caller of
                    // `submit_pages` / `submit_reads` keeps mutably borrowed — so nobody else frees,
                    // moves or reads it — until this function returns, and this
                    // function returns only after the entry's completion is reaped
                    // (the loop ends when `outstanding` is 0, and the error path
                    // drains every entry the kernel took). The length keeps the IO
                    // inside the buffer.
                    if unsafe { sq.push(&entry) }.is_err() {
                        // The queue is full although fewer than `capacity` entries
                        // are outstanding: cannot happen; try again next round.
                        pending.push(i);
                        break;
                    }
                    outstanding += 1;
                }
            }
            if outstanding == 0 {
                if pending.is_empty() {
                    break;
                }
                // Nothing is in flight, yet the queue took nothing: cannot happen with
                // a clean ring; report it rather than loop.
                let e = io::Error::other("the io_uring submission queue refused entries");
                return (
                    Err(first_error.unwrap_or((pending[0], e))),
                    RingState::Unknown,
                );
            }
            match ring.submit_and_wait(outstanding) {
                Ok(_) => {}
                Err(e) => match e.raw_os_error() {
                    // Interrupted, or the kernel is short of resources or has
                    // completions to flush: reap what is there and go again.
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY) => {}
                    _ => {
                        self.drain(ring, &mut outstanding);
                        let failure = first_error.map_or((0, e), |f| f);
                        return (Err(failure), RingState::Unknown);
                    }
                },
            }
            let mut reaped = 0usize;
            for cqe in ring.completion() {
                reaped += 1;
                let i = cqe.user_data() as usize;
                if i >= n {
                    // Not an entry of this batch (a clean ring holds none); no
                    // panic here, with pages in the kernel's hands.
                    debug_assert!(false, "completion {i} for a request never made");
                    continue;
                }
                let res = cqe.result();
                let p = &mut progress[i];
                let outcome = if res >= 0 {
                    self.transferred(i, p, res as usize)
                } else if (res == -libc::EAGAIN || res == -libc::EINTR) && p.retries < MAX_RETRIES {
                    p.retries += 1;
                    Ok(true)
                } else {
                    Err(io::Error::from_raw_os_error(-res))
                };
                match outcome {
                    Ok(true) => pending.push(i),
                    Ok(false) => {}
                    Err(e) => {
                        if first_error.as_ref().is_none_or(|(j, _)| i < *j) {
                            first_error = Some((i, e));
                        }
                    }
                }
            }
            outstanding -= reaped;
            if reaped == 0 {
                // Nothing completed (an interrupted wait); give other threads the core.
                std::thread::yield_now();
            }
        }
        let result = match first_error {
            Some(failure) => Err(failure),
            None => Ok(()),
        };
        (result, RingState::Clean)
    }

    /// Accounts `bytes` transferred for request `i`. Returns whether the request needs
    /// another submission (a short transfer), or the error that ends it.
    fn transferred(&self, i: usize, p: &mut Progress, bytes: usize) -> io::Result<bool> {
        if bytes == 0 {
            let at = self.requests[i].offset + p.done_bytes as u64;
            return Err(match self.dir {
                Direction::Read => io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("read reached the end of the file at byte {at}"),
                ),
                Direction::Write => io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("write made no progress at byte {at}"),
                ),
            });
        }
        // The kernel never moves more than asked; `min` keeps a broken kernel from
        // sending the next entry's pointer outside the buffer.
        let len = self.requests[i].len;
        p.done_bytes = (p.done_bytes + bytes).min(len);
        Ok(p.done_bytes < len)
    }

    /// After `io_uring_enter` failed unexpectedly: see [`drain`].
    fn drain(&self, ring: &mut IoUring, outstanding: &mut usize) {
        drain(ring, outstanding);
    }
}

/// Waits until every entry the kernel took of the `outstanding` pushed into `ring`
/// has completed, discarding their completions, so that no buffer is still in the
/// kernel's hands when the caller frees it. Entries still queued were never taken;
/// after a failure the ring is closed with them (its state is unknown), so they never
/// run.
pub(super) fn drain(ring: &mut IoUring, outstanding: &mut usize) {
    loop {
        let mut reaped = 0;
        for _ in ring.completion() {
            reaped += 1;
        }
        *outstanding -= reaped;
        let mut sq = ring.submission();
        sq.sync();
        let queued = sq.len();
        drop(sq);
        // In a SQPOLL ring the kernel thread may still take queued entries, so
        // wait for those too.
        let waiting_for = if ring.params().is_setup_sqpoll() {
            *outstanding
        } else {
            outstanding.saturating_sub(queued)
        };
        if waiting_for == 0 {
            return;
        }
        // Wait for one completion without submitting anything: entries never taken
        // must stay untaken. Deferred task work runs only in such a wait. If even
        // this fails, sleep: non-deferred task work runs on the way back from the
        // sleep's system call.
        // SAFETY: no submission and no argument pointer; the call only waits.
        let waited = unsafe {
            ring.submitter()
                .enter::<libc::sigset_t>(0, 1, ENTER_GETEVENTS, None)
        };
        if waited.is_err() {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn probe_works_here() {
        probe().expect("io_uring is allowed on the build machine");
    }

    #[test]
    fn test_hook_disables_only_this_thread() {
        std::thread::spawn(|| {
            simulate_io_uring_disabled_for_test(true);
            let e = probe().unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        })
        .join()
        .unwrap();
        probe().unwrap();
    }

    #[test]
    fn batch_larger_than_the_ring_round_trips_and_eof_is_reported() {
        let file = tempfile::tempfile().unwrap();
        let n = RING_ENTRIES as usize * 2 + 3;
        let mut pages: Vec<Box<Page>> = (0..n)
            .map(|i| {
                let mut p = Page::boxed();
                p.as_bytes_mut().fill(i as u8);
                p
            })
            .collect();
        let mut reqs: Vec<(PageNo, &mut Page)> = pages
            .iter_mut()
            .enumerate()
            .map(|(i, p)| (PageNo(i as u64), &mut **p))
            .collect();
        submit_pages(file.as_raw_fd(), Direction::Write, false, &mut reqs).unwrap();
        let mut back: Vec<Box<Page>> = (0..n + 1).map(|_| Page::boxed()).collect();
        let mut reqs: Vec<(PageNo, &mut Page)> = back
            .iter_mut()
            .enumerate()
            .map(|(i, p)| (PageNo(i as u64), &mut **p))
            .collect();
        // The last page lies past the end of the file.
        let (i, e) = submit_pages(file.as_raw_fd(), Direction::Read, false, &mut reqs).unwrap_err();
        assert_eq!((i, e.kind()), (n, io::ErrorKind::UnexpectedEof));
        for (i, p) in back.iter().take(n).enumerate() {
            assert!(p.as_bytes().iter().all(|&b| b == i as u8), "page {i}");
        }
    }

    #[test]
    fn reads_of_two_files_at_any_offsets_and_lengths_come_back_whole() {
        use std::os::unix::fs::FileExt;
        let files = [tempfile::tempfile().unwrap(), tempfile::tempfile().unwrap()];
        let content = |f: usize, at: usize| (at * 7 + f * 3) as u8;
        for (f, file) in files.iter().enumerate() {
            let bytes: Vec<u8> = (0..20_000).map(|at| content(f, at)).collect();
            file.write_all_at(&bytes, 0).unwrap();
        }
        let plan: Vec<(usize, u64, usize)> = (0..RING_ENTRIES as usize + 40)
            .map(|i| (i % 2, (i * 37 % 15_000) as u64, 1 + i * 13 % 4096))
            .collect();
        let mut bufs: Vec<Vec<u8>> = plan.iter().map(|&(_, _, len)| vec![0; len]).collect();
        let mut reads: Vec<ReadAt<'_>> = plan
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&(f, offset, _), buf)| ReadAt {
                fd: files[f].as_raw_fd(),
                offset,
                buf,
            })
            .collect();
        submit_reads(false, &mut reads).unwrap();
        for (&(f, offset, _), buf) in plan.iter().zip(&bufs) {
            for (k, &b) in buf.iter().enumerate() {
                assert_eq!(
                    b,
                    content(f, offset as usize + k),
                    "file {f} at {offset}+{k}"
                );
            }
        }
        let mut past = vec![0u8; 100];
        let mut reads = [ReadAt {
            fd: files[0].as_raw_fd(),
            offset: 19_950,
            buf: &mut past,
        }];
        let (i, e) = submit_reads(false, &mut reads).unwrap_err();
        assert_eq!((i, e.kind()), (0, io::ErrorKind::UnexpectedEof));
    }

    #[test]
    fn bad_descriptor_is_an_error_and_the_ring_stays_usable() {
        let mut page = Page::boxed();
        let mut reqs = [(PageNo(0), &mut *page)];
        let (i, e) = submit_pages(-1, Direction::Read, false, &mut reqs).unwrap_err();
        assert_eq!((i, e.raw_os_error()), (0, Some(libc::EBADF)));
        probe().unwrap();
    }
}
