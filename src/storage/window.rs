//! A thread's window of device reads in flight: reads are added as their operations
//! ask for them and taken back as each completes, so that the disk always has work
//! while the thread has operations waiting, instead of the window emptying at the end
//! of every round (issue 35, item 2).
//!
//! The window owns each read's buffer from [`ReadWindow::add`] until it hands the
//! buffer back in a [`Finished`]; a caller never holds a buffer the kernel may write.
//! Reads go on a ring of the thread's own (a slot beside the plain and SQPOLL rings
//! of [`super::uring`]), built on first use and kept when the window is dropped clean.
//! A thread where io_uring cannot be had reads each file read where it is added
//! (`pread`), and the window answers it at the next [`ReadWindow::wait`].
//!
//! Invariants this module owns:
//! - A buffer in the window is neither freed nor handed out while an entry for it may
//!   be in the kernel's hands: [`ReadWindow::wait`] hands a read out only with its
//!   completion reaped, and the window's drop waits for every entry the kernel took
//!   (a ring whose state is unknown is closed after that wait, with its untaken
//!   entries, before any buffer is freed).
//! - Short reads are continued from where they stopped, `EAGAIN` and `EINTR` retried a
//!   bounded number of times; a read that reaches the end of its file is an
//!   [`io::ErrorKind::UnexpectedEof`] error. Every read added is finished exactly once.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use io_uring::{IoUring, opcode, types};

use super::AlignedBuf;
use super::uring::{self, MAX_RETRIES};

/// A read the window finished: the caller's tag, the buffer it was added with, and
/// whether all of the buffer was read.
pub(crate) struct Finished {
    /// The tag given to [`ReadWindow::add`].
    pub(crate) tag: u64,
    /// The buffer, holding the bytes read if `result` is `Ok`.
    pub(crate) buf: AlignedBuf,
    /// The read's outcome.
    pub(crate) result: io::Result<()>,
}

/// One read of the window.
struct Slot {
    file: Arc<File>,
    offset: u64,
    buf: AlignedBuf,
    done_bytes: usize,
    retries: u32,
    tag: u64,
}

/// The reads one thread has in flight (module docs).
pub(crate) struct ReadWindow {
    /// `None` before the first read and where io_uring cannot be had (reads are done as
    /// they are added).
    ring: Option<IoUring>,
    /// Whether the ring was asked for (at the first read).
    asked: bool,
    /// Reads by slot number (an entry's user data); `None` for a free slot.
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    /// Slots waiting for room in the submission queue: new reads, or continuations of
    /// short ones.
    queued: VecDeque<usize>,
    /// Entries pushed into the submission queue and not reaped.
    outstanding: usize,
    /// Reads finished and not yet handed out.
    finished: Vec<Finished>,
}

impl ReadWindow {
    /// An empty window; it takes this thread's window ring at its first read.
    pub(crate) fn new() -> ReadWindow {
        ReadWindow {
            ring: None,
            asked: false,
            slots: Vec::new(),
            free: Vec::new(),
            queued: VecDeque::new(),
            outstanding: 0,
            finished: Vec::new(),
        }
    }

    /// Adds a read of `buf.len()` bytes of `file` at `offset` (aligned as the file
    /// needs), answered later by [`ReadWindow::wait`] with `tag`. Nothing goes to the
    /// kernel before the next [`ReadWindow::submit`] or [`ReadWindow::wait`].
    pub(crate) fn add(&mut self, file: Arc<File>, offset: u64, mut buf: AlignedBuf, tag: u64) {
        if !self.asked {
            self.asked = true;
            self.ring = uring::take_window_ring();
        }
        if self.ring.is_none() {
            let result = file.read_exact_at(buf.as_mut(), offset);
            self.finished.push(Finished { tag, buf, result });
            return;
        }
        let slot = Slot {
            file,
            offset,
            buf,
            done_bytes: 0,
            retries: 0,
            tag,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        self.queued.push_back(i);
    }

    /// Reads added and not yet handed out by [`ReadWindow::wait`].
    pub(crate) fn len(&self) -> usize {
        self.slots.len() - self.free.len() + self.finished.len()
    }

    /// Sends the reads added since the last call to the kernel, without waiting.
    pub(crate) fn submit(&mut self) {
        if self.push_queued() > 0 {
            self.enter(0);
        }
    }

    /// Sends what was added, waits until at least `want` reads finished (at least one;
    /// fewer if the window holds fewer), and hands out every read finished by then.
    ///
    /// Waiting for more than one completion per call trades a little of the window's
    /// depth for fewer system calls: each `io_uring_enter` both submits the reads added
    /// since the last and reaps, and on a virtual machine each submission's doorbell is
    /// costly, so reads submitted together cost less each.
    pub(crate) fn wait(&mut self, want: usize) -> Vec<Finished> {
        while self.finished.is_empty() && self.len() > 0 {
            self.push_queued();
            if self.outstanding == 0 {
                // The queue took nothing although no entry is outstanding: cannot
                // happen with a clean ring. Read what is left where it is.
                self.abandon_ring();
                continue;
            }
            if self.enter(want.clamp(1, self.outstanding)) {
                self.reap();
            }
        }
        std::mem::take(&mut self.finished)
    }

    /// Pushes queued reads into the submission queue while it has room; returns how
    /// many.
    fn push_queued(&mut self) -> usize {
        let Some(ring) = self.ring.as_mut() else {
            return 0;
        };
        let capacity = ring.params().sq_entries() as usize;
        let mut pushed = 0;
        let mut sq = ring.submission();
        while self.outstanding < capacity {
            let Some(&i) = self.queued.front() else { break };
            let slot = self.slots[i].as_mut().expect("a queued slot is in use");
            let len = slot.buf.as_ref().len() - slot.done_bytes;
            // The pointer stays inside the buffer: `done_bytes < len` for a queued read.
            let ptr = slot.buf.as_mut().as_mut_ptr().wrapping_add(slot.done_bytes);
            let entry = opcode::Read::new(types::Fd(slot.file.as_raw_fd()), ptr, len as u32)
                .offset(slot.offset + slot.done_bytes as u64)
                .build()
                .user_data(i as u64);
            // SAFETY: the entry points into the slot's buffer and its file, which the
            // window owns until the entry's completion is reaped (`wait` hands a read
            // out only then, and the drop waits for every entry the kernel took); the
            // length keeps the IO inside the buffer.
            if unsafe { sq.push(&entry) }.is_err() {
                break;
            }
            self.queued.pop_front();
            self.outstanding += 1;
            pushed += 1;
        }
        pushed
    }

    /// Submits the pushed entries and waits for `want` completions. Returns whether
    /// completions may be there to reap; on an unexpected error the ring is given up
    /// (module docs) and the reads not yet done are read where they are.
    fn enter(&mut self, want: usize) -> bool {
        let Some(ring) = self.ring.as_mut() else {
            return false;
        };
        match ring.submit_and_wait(want) {
            Ok(_) => true,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) =>
            {
                true
            }
            Err(_) => {
                self.abandon_ring();
                false
            }
        }
    }

    /// Takes every completion there is.
    fn reap(&mut self) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let completions: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (data, res) in completions {
            self.outstanding -= 1;
            let i = data as usize;
            let Some(slot) = self.slots.get_mut(i).and_then(Option::as_mut) else {
                debug_assert!(false, "a completion for slot {i}, which holds no read");
                continue;
            };
            let outcome = if res > 0 {
                slot.done_bytes = (slot.done_bytes + res as usize).min(slot.buf.as_ref().len());
                if slot.done_bytes < slot.buf.as_ref().len() {
                    None
                } else {
                    Some(Ok(()))
                }
            } else if res == 0 {
                Some(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "read reached the end of the file at byte {}",
                        slot.offset + slot.done_bytes as u64
                    ),
                )))
            } else if (res == -libc::EAGAIN || res == -libc::EINTR) && slot.retries < MAX_RETRIES {
                slot.retries += 1;
                None
            } else {
                Some(Err(io::Error::from_raw_os_error(-res)))
            };
            match outcome {
                None => self.queued.push_back(i),
                Some(result) => self.finish(i, result),
            }
        }
    }

    /// Hands read `i` out with `result`.
    fn finish(&mut self, i: usize, result: io::Result<()>) {
        let slot = self.slots[i].take().expect("a finished read is in use");
        self.free.push(i);
        self.finished.push(Finished {
            tag: slot.tag,
            buf: slot.buf,
            result,
        });
    }

    /// After the ring failed: waits for every entry the kernel took, closes the ring,
    /// and reads what is not done with `pread`.
    fn abandon_ring(&mut self) {
        if let Some(mut ring) = self.ring.take() {
            uring::drain(&mut ring, &mut self.outstanding);
            drop(ring);
        }
        self.outstanding = 0;
        self.queued.clear();
        for i in 0..self.slots.len() {
            let Some(slot) = self.slots[i].as_mut() else {
                continue;
            };
            let at = slot.offset + slot.done_bytes as u64;
            let start = slot.done_bytes;
            let result = slot.file.read_exact_at(&mut slot.buf.as_mut()[start..], at);
            self.finish(i, result);
        }
    }
}

impl Drop for ReadWindow {
    fn drop(&mut self) {
        let Some(mut ring) = self.ring.take() else {
            return;
        };
        if self.outstanding > 0 {
            uring::drain(&mut ring, &mut self.outstanding);
        }
        // The slots' buffers are freed after this, with the ring idle or closed (with
        // entries it never took).
        if self.outstanding == 0 {
            uring::put_window_ring(ring);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn content(at: usize) -> u8 {
        (at * 31 % 251) as u8
    }

    #[test]
    fn reads_finish_each_once_whole_and_the_window_refills() {
        let file = tempfile::tempfile().unwrap();
        let bytes: Vec<u8> = (0..1 << 20).map(content).collect();
        file.write_all_at(&bytes, 0).unwrap();
        let file = Arc::new(file);
        let mut window = ReadWindow::new();
        let mut asked = HashMap::new();
        let mut next = 0u64;
        let mut add = |window: &mut ReadWindow, asked: &mut HashMap<u64, (u64, usize)>| {
            let offset = next * 4093 % (1 << 19);
            let len = 1 + (next as usize * 977) % 8192;
            window.add(Arc::clone(&file), offset, AlignedBuf::new(len), next);
            asked.insert(next, (offset, len));
            next += 1;
        };
        // More than a ring holds, then one more for each one that finishes.
        for _ in 0..300 {
            add(&mut window, &mut asked);
        }
        window.submit();
        let mut finished = 0;
        while window.len() > 0 {
            for done in window.wait(1) {
                done.result.unwrap();
                let (offset, len) = asked.remove(&done.tag).expect("finished once");
                assert_eq!(done.buf.as_ref().len(), len);
                for (k, &b) in done.buf.as_ref().iter().enumerate() {
                    assert_eq!(b, content(offset as usize + k), "read {} at {k}", done.tag);
                }
                finished += 1;
                if finished < 200 {
                    add(&mut window, &mut asked);
                }
            }
        }
        assert!(asked.is_empty());
        assert_eq!(finished, 499);
        // Past the end of the file: an error, not a hang.
        window.add(Arc::clone(&file), (1 << 20) - 10, AlignedBuf::new(100), 7);
        let done = window.wait(1);
        assert_eq!(done.len(), 1);
        assert_eq!(
            done[0].result.as_ref().unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn a_window_without_io_uring_reads_where_it_adds() {
        std::thread::spawn(|| {
            uring::simulate_io_uring_disabled_for_test(true);
            let file = tempfile::tempfile().unwrap();
            file.write_all_at(&[9u8; 8192], 0).unwrap();
            let mut window = ReadWindow::new();
            window.add(Arc::new(file), 4096, AlignedBuf::new(4096), 1);
            let done = window.wait(1);
            assert_eq!(done.len(), 1);
            done[0].result.as_ref().unwrap();
            assert!(done[0].buf.as_ref().iter().all(|&b| b == 9));
            assert_eq!(window.len(), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn dropping_a_window_with_reads_in_flight_waits_for_them() {
        let file = Arc::new(tempfile::tempfile().unwrap());
        file.write_all_at(&vec![3u8; 1 << 20], 0).unwrap();
        for _ in 0..20 {
            let mut window = ReadWindow::new();
            for i in 0..64 {
                window.add(Arc::clone(&file), i * 8192, AlignedBuf::new(8192), i);
            }
            window.submit();
            // Dropped with the reads in the kernel's hands: the drop waits for them
            // before their buffers are freed, and the ring serves the next window.
        }
        let mut window = ReadWindow::new();
        window.add(file, 0, AlignedBuf::new(4096), 0);
        assert!(window.wait(1)[0].result.is_ok());
    }
}
