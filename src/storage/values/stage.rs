//! Write-behind for the value store: a value of at most [`STAGE_MAX_BYTES`] is copied
//! into an aligned buffer and queued, and its writer goes on; one thread per store
//! (`bfdb-values`) writes what is queued, a whole queue at a time with every write in
//! flight together on io_uring (or one after another through the device where it
//! cannot), and reads of a value still queued or in flight are served from its buffer.
//!
//! A writer of a long value at `Unlogged` or `Logged` then waits for no disk, and many
//! writers' values reach the device at once instead of one `pwrite` each. Durability is
//! unchanged: [`Stager::wait_written`] waits until every value staged before it is on
//! the device, and the store's sync calls it before syncing the device, so the log's
//! group write (which syncs the store first) and a checkpoint still never make a record
//! durable before the value it names.
//!
//! Invariants:
//! - A staged extent stays in `staged` from its staging until its write completed, so
//!   a reader either finds its buffer or finds the bytes on the device. (A reader holds
//!   a reference the index gave it, placed after the value was staged.)
//! - Writes complete in staging order as counted by `done`: the thread takes the whole
//!   queue, writes it, and only then counts it done, one batch after another.
//! - An extent is never staged twice at once: an extent is reused only after a release,
//!   which follows a checkpoint's sync, which waited for the extent's write.
//! - At most `limit` bytes are staged: a writer past it waits for room (or, for a value
//!   larger than the limit, writes it itself).

use std::collections::BTreeMap;
use std::sync::Arc;

// A thread of its own and a condition variable: parking_lot's, whatever the `sync`
// shim holds (shuttle builds leave the stager out: the store writes synchronously).
use parking_lot::{Condvar, Mutex};

use super::super::{AlignedBuf, BlockDevice};

/// The longest extent written behind; longer ones are written by their writer (their
/// cost is the device's bandwidth, which a queue does not change).
pub(crate) const STAGE_MAX_BYTES: u64 = 256 << 10;

/// Extents queued or being written, and what the thread and the waiters share.
struct Queue {
    /// Staged and not yet handed to the thread, in staging order.
    waiting: Vec<(u64, Arc<AlignedBuf>)>,
    /// Every extent staged whose write has not completed, by address.
    staged: BTreeMap<u64, Arc<AlignedBuf>>,
    /// Bytes of `staged`.
    staged_bytes: u64,
    /// Extents staged so far, and of them those whose writes completed (or failed).
    count: u64,
    done: u64,
    /// Why a write failed: every later wait answers it.
    failed: Option<String>,
    stop: bool,
}

/// The shared half: the queue and its condition variable.
struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when the queue has work, when writes completed, and to stop.
    changed: Condvar,
    limit: u64,
}

/// The write-behind of one value store.
pub(crate) struct Stager {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Stager {
    /// A stager writing to `device`, staging at most `limit` bytes at once.
    pub(crate) fn start(device: Arc<dyn BlockDevice>, limit: u64) -> std::io::Result<Stager> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                waiting: Vec::new(),
                staged: BTreeMap::new(),
                staged_bytes: 0,
                count: 0,
                done: 0,
                failed: None,
                stop: false,
            }),
            changed: Condvar::new(),
            limit,
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("bfdb-values".into())
            .spawn(move || {
                // A panic fails the store instead of leaving its writers waiting.
                let run = std::panic::AssertUnwindSafe(|| worker.run(&*device));
                if let Err(panic) = std::panic::catch_unwind(run) {
                    let why = crate::ticker::panic_message(&*panic);
                    let mut q = worker.queue.lock();
                    q.failed
                        .get_or_insert_with(|| format!("the value store's writer panicked: {why}"));
                    q.done = q.count;
                    drop(q);
                    worker.changed.notify_all();
                }
            })?;
        Ok(Stager {
            shared,
            thread: Some(thread),
        })
    }

    /// Whether an extent of `bytes` is written behind.
    pub(crate) fn takes(&self, bytes: u64) -> bool {
        bytes <= STAGE_MAX_BYTES && bytes <= self.shared.limit
    }

    /// Queues `bytes` (the whole extent image) for address `address`, waiting for room
    /// under the limit first. Fails (staging nothing) once a write failed.
    pub(crate) fn stage(&self, address: u64, bytes: AlignedBuf) -> Result<(), String> {
        let len = image(&bytes).len() as u64;
        let bytes = Arc::new(bytes);
        let mut q = self.shared.queue.lock();
        loop {
            if let Some(cause) = &q.failed {
                return Err(cause.clone());
            }
            if q.staged_bytes + len <= self.shared.limit || q.staged.is_empty() {
                break;
            }
            self.shared.changed.wait(&mut q);
        }
        debug_assert!(!q.staged.contains_key(&address), "an extent staged twice");
        q.staged.insert(address, Arc::clone(&bytes));
        q.staged_bytes += len;
        q.count += 1;
        q.waiting.push((address, bytes));
        drop(q);
        self.shared.changed.notify_all();
        Ok(())
    }

    /// The staged bytes of the extent holding `[address, address + len)`, if its write
    /// has not completed: the extent's address and image.
    pub(crate) fn find(&self, address: u64, len: u64) -> Option<(u64, Arc<AlignedBuf>)> {
        let q = self.shared.queue.lock();
        let (&at, bytes) = q.staged.range(..=address).next_back()?;
        (address + len <= at + image(bytes).len() as u64).then(|| (at, Arc::clone(bytes)))
    }

    /// Whether some staged write has not completed.
    #[cfg(all(test, not(feature = "shuttle")))]
    pub(crate) fn busy(&self) -> bool {
        let q = self.shared.queue.lock();
        q.done < q.count
    }

    /// Waits until every extent staged before the call is written; the failure of one
    /// that failed.
    pub(crate) fn wait_written(&self) -> Result<(), String> {
        let mut q = self.shared.queue.lock();
        let target = q.count;
        while q.done < target && q.failed.is_none() {
            self.shared.changed.wait(&mut q);
        }
        match &q.failed {
            Some(cause) => Err(cause.clone()),
            None => Ok(()),
        }
    }
}

impl Drop for Stager {
    /// Writes what is staged, then stops the thread.
    fn drop(&mut self) {
        self.shared.queue.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Shared {
    /// The thread: takes the whole queue, writes it, counts it done; until stopped with
    /// nothing left.
    fn run(&self, device: &dyn BlockDevice) {
        loop {
            let batch = {
                let mut q = self.queue.lock();
                while q.waiting.is_empty() && !q.stop {
                    self.changed.wait(&mut q);
                }
                if q.waiting.is_empty() {
                    return;
                }
                std::mem::take(&mut q.waiting)
            };
            let result = write_batch(device, &batch);
            let mut q = self.queue.lock();
            if let Err(cause) = result {
                q.failed.get_or_insert(cause);
            } else {
                // Failed writes stay staged: their bytes are still readable.
                for (address, bytes) in &batch {
                    q.staged.remove(address);
                    q.staged_bytes -= image(bytes).len() as u64;
                }
            }
            q.done += batch.len() as u64;
            drop(q);
            self.changed.notify_all();
        }
    }
}

/// The bytes of a staged image.
fn image(bytes: &AlignedBuf) -> &[u8] {
    bytes.as_ref()
}

/// Writes `batch` to `device`: all at once on io_uring where every extent has a file
/// target, else (or if the ring refuses) each through the device.
fn write_batch(device: &dyn BlockDevice, batch: &[(u64, Arc<AlignedBuf>)]) -> Result<(), String> {
    let targets: Option<Vec<_>> = batch
        .iter()
        .map(|(address, bytes)| device.write_target(*address, image(bytes).len()))
        .collect();
    if let Some(targets) = targets {
        use std::os::fd::AsRawFd;
        let writes: Vec<crate::storage::uring::WriteAt<'_>> = targets
            .iter()
            .zip(batch)
            .map(
                |((file, offset), (_, bytes))| crate::storage::uring::WriteAt {
                    fd: file.as_raw_fd(),
                    offset: *offset,
                    buf: image(bytes),
                },
            )
            .collect();
        if crate::storage::uring::submit_writes(false, &writes).is_ok() {
            return Ok(());
        }
        // Some write failed or the ring could not be built: write them all again one
        // by one, which reports the error that stays.
    }
    for (address, bytes) in batch {
        // In pieces that straddle no segment.
        let image = image(bytes);
        let mut at = 0;
        while at < image.len() {
            let here = *address + at as u64;
            let n = device.segment_piece(here, (image.len() - at) as u64) as usize;
            device.write(here, &image[at..at + n]).map_err(|e| {
                let file = device
                    .file_of(here)
                    .map_or_else(|| "the value file".to_string(), |p| p.display().to_string());
                format!("a write of the value file {file} at address {here} failed: {e}")
            })?;
            at += n;
        }
    }
    Ok(())
}
