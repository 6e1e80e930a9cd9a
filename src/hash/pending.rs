//! Pending reads: the operations of a batch that need records from a log's device
//! (FASTER's pending operations and `CompletePending`), so that one thread keeps many
//! device reads in flight instead of one.
//!
//! An operation runs from its start under a guard made by
//! [`EpochHandle::protect_batched`]. When a chain walk reaches a record below HEAD,
//! [`HybridLog::fetch`] asks the batch's [`ReadBatch`]: a record read earlier is decoded
//! from the bytes read; any other is noted as wanted, and the operation stops with the
//! *pending signal*, an error value that never leaves the batch ([`pipelined`] and
//! [`Rounds`] consume it). [`pipelined`] (`get_many`) puts each wanted read into the
//! thread's [`ReadWindow`] at once and runs an operation again as soon as its read
//! completes, so the window stays full while operations wait; [`Rounds`] (the async
//! read of one key) and [`read_ahead`] (compaction) run every open operation in rounds,
//! a round's reads going to the device together — on segment files as one io_uring
//! batch ([`read_now`]), or awaited on a tokio-uring runtime.
//!
//! Why an operation runs again from its start rather than resuming where it stopped:
//! its memory work (index probe, in-memory part of the chain) costs little beside a
//! device read; a rerun sees the chains as they are now, so a write that came between
//! rounds is found; and its side effects (a read-cache copy) happen only in the run that
//! finishes. The bytes of an earlier round stay right: a log address is written once
//! and a record below HEAD never changes, and whether the address still counts (BEGIN)
//! is checked by `fetch` each time, before the batch is asked.
//!
//! Invariants this module owns:
//! - The pending signal is made only under a batched guard, and the makers of such
//!   guards ([`pipelined`], [`Rounds::round`], [`read_ahead`]) turn it back into "not
//!   finished".
//! - A read is set up under the guard whose holder saw its address at or above BEGIN: a
//!   device without files reads it right then; for a segment file the read takes the
//!   open file ([`BlockDevice::read_target`]), whose bytes a truncation cannot take away
//!   (unlinking keeps an open file's data), so it may run after the guard is dropped.
//! - Every batch ends: a read that failed is simply not kept (its operation asks again),
//!   and an operation run more than [`MAX_ROUNDS`] times runs on the blocking path,
//!   which reports errors and falls back as a single read does.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::Arc;

use super::epoch::{EpochGuard, EpochHandle};
use super::hlog::{FIRST_READ_BYTES, HybridLog};
use super::record::DiskRecord;
use crate::error::{Error, Result};
use crate::storage::{AlignedBuf, BlockDevice, ReadWindow};
use crate::sync::Mutex;

/// Rounds a batch runs before its unfinished operations take the blocking path. An
/// operation needs one round per device read it makes: a cold read usually two (its
/// index chunk, its record), more where its chain holds other keys.
pub(crate) const MAX_ROUNDS: usize = 8;

/// The pending signal's payload: an operation of a batch stopped to wait for a read.
#[derive(Debug)]
struct ReadPending;

impl std::fmt::Display for ReadPending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a batched read is pending (internal; never returned to callers)")
    }
}

impl std::error::Error for ReadPending {}

fn pending() -> Error {
    Error::Io(io::Error::new(io::ErrorKind::WouldBlock, ReadPending))
}

fn is_pending(e: &Error) -> bool {
    matches!(e, Error::Io(e) if e.get_ref().is_some_and(|inner| inner.is::<ReadPending>()))
}

/// The device reads of one batch: those its operations asked for in this round, and
/// the bytes earlier rounds read.
#[derive(Default)]
pub(crate) struct ReadBatch {
    state: Mutex<BatchState>,
}

#[derive(Default)]
struct BatchState {
    wanted: Vec<Want>,
    /// By (log, record address).
    read: HashMap<(usize, u64), ReadBytes>,
    /// Set once [`read_ahead`] is done: a record not read ahead is read on the spot
    /// instead of asked for.
    blocking_misses: bool,
    /// Records read on the spot that way.
    misses: u64,
    /// The operation running now, whose wants these are ([`pipelined`]).
    current: usize,
}

/// Bytes read from a log's device at `start`.
struct ReadBytes {
    start: u64,
    bytes: AlignedBuf,
    /// Counted in the log's record reads (the first time an operation used it).
    counted: bool,
}

/// A read an operation asked for: `len` bytes at `start` of a log's device, for the
/// record at `address`.
struct Want {
    /// The operation that asked (its index in the batch).
    op: usize,
    log: usize,
    address: u64,
    start: u64,
    len: usize,
    device: Arc<dyn BlockDevice>,
}

/// One read of a round, set up: a [`Want`] (one per record) with its buffer.
pub(crate) struct DeviceRead {
    log: usize,
    address: u64,
    start: u64,
    buf: AlignedBuf,
    /// The open file and offset to read from, for a device of segment files.
    target: Option<(Arc<File>, u64)>,
    /// The bytes are in `buf`.
    done: bool,
}

impl DeviceRead {
    /// The open file and offset this read is for, and its buffer, if it is still to do
    /// and a file takes it.
    pub(crate) fn file_read(&mut self) -> Option<(&Arc<File>, u64, &mut AlignedBuf)> {
        match &self.target {
            Some((file, offset)) if !self.done => Some((file, *offset, &mut self.buf)),
            _ => None,
        }
    }

    /// Notes that the bytes were read into the buffer.
    pub(crate) fn set_done(&mut self) {
        self.done = true;
    }

    /// Takes `bytes`, read elsewhere from this read's file and offset (as many as its
    /// buffer holds), as its bytes.
    #[cfg(feature = "tokio-uring")]
    pub(crate) fn fill(&mut self, bytes: &[u8]) {
        self.buf.as_mut().copy_from_slice(bytes);
        self.done = true;
    }
}

impl ReadBatch {
    /// The record at `address` of `log` (below HEAD, at or above BEGIN as the caller
    /// saw under its guard): decoded from an earlier round's bytes, or noted as wanted
    /// and answered with the pending signal.
    pub(crate) fn record(&self, log: &HybridLog, address: u64) -> Result<DiskRecord> {
        let mut state = self.state.lock();
        let need = match state.read.get_mut(&(log.id(), address)) {
            Some(read) => {
                if !read.counted {
                    read.counted = true;
                    log.count_record_reads(1);
                }
                match log.decode_read(address, read.start, read.bytes.as_ref())? {
                    Ok(record) => return Ok(record),
                    Err(need) => need,
                }
            }
            None => FIRST_READ_BYTES,
        };
        if state.blocking_misses {
            state.misses += 1;
            drop(state);
            return log.read_from_device(address);
        }
        let (start, len) = log.device_span(address, need);
        let op = state.current;
        state.wanted.push(Want {
            op,
            log: log.id(),
            address,
            start,
            len,
            device: Arc::clone(log.device()),
        });
        Err(pending())
    }

    /// The `len` bytes at `address` of `device` (named `source` among the batch's reads,
    /// as a log is by its id; a cold run's unit, say): `use_bytes` runs on them if an
    /// earlier round read them; otherwise they are noted as wanted and the pending signal
    /// answers (after [`read_ahead`], they are read on the spot instead). The caller saw
    /// the address valid under its guard, and the bytes there never change.
    pub(crate) fn bytes_at<R>(
        &self,
        source: usize,
        device: &Arc<dyn BlockDevice>,
        address: u64,
        len: usize,
        use_bytes: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let mut state = self.state.lock();
        if let Some(read) = state.read.get(&(source, address))
            && read.bytes.as_ref().len() >= len
        {
            return Ok(use_bytes(&read.bytes.as_ref()[..len]));
        }
        if state.blocking_misses {
            state.misses += 1;
            drop(state);
            let mut buf = AlignedBuf::new(len);
            device.read(address, buf.as_mut())?;
            return Ok(use_bytes(buf.as_ref()));
        }
        let op = state.current;
        state.wanted.push(Want {
            op,
            log: source,
            address,
            start: address,
            len,
            device: Arc::clone(device),
        });
        Err(pending())
    }

    /// Takes the round's wanted reads, one per record (the longest asked for), with
    /// their files; a device without files reads them right away. Called under the
    /// guard of the round whose operations asked.
    fn issue(&self) -> Vec<DeviceRead> {
        let wanted = std::mem::take(&mut self.state.lock().wanted);
        let mut unique: Vec<Want> = Vec::with_capacity(wanted.len());
        let mut seen: HashMap<(usize, u64), usize> = HashMap::new();
        for want in wanted {
            match seen.get(&(want.log, want.address)) {
                Some(&i) if unique[i].len >= want.len => {}
                Some(&i) => unique[i] = want,
                None => {
                    seen.insert((want.log, want.address), unique.len());
                    unique.push(want);
                }
            }
        }
        unique
            .into_iter()
            .map(|want| {
                let mut buf = AlignedBuf::new(want.len);
                let target = want.device.read_target(want.start, want.len);
                // A failed read is not kept: its operation asks again (module docs).
                let done = target.is_none() && want.device.read(want.start, buf.as_mut()).is_ok();
                DeviceRead {
                    log: want.log,
                    address: want.address,
                    start: want.start,
                    buf,
                    target,
                    done,
                }
            })
            .collect()
    }

    /// Keeps the bytes of the `reads` that were done for the next round.
    fn complete(&self, reads: Vec<DeviceRead>) {
        let mut state = self.state.lock();
        for read in reads.into_iter().filter(|r| r.done) {
            state.read.insert(
                (read.log, read.address),
                ReadBytes {
                    start: read.start,
                    bytes: read.buf,
                    counted: false,
                },
            );
        }
    }
}

/// Does the reads of `reads` still to do, on segment files as one io_uring batch on
/// this thread's ring. Reads the ring fails (or all, if it cannot be had) stay not
/// done.
pub(crate) fn read_now(reads: &mut [DeviceRead]) {
    use std::os::fd::AsRawFd;
    let mut ring_reads = Vec::new();
    let mut which = Vec::new();
    for (i, read) in reads.iter_mut().enumerate() {
        if let Some((file, offset, buf)) = read.file_read() {
            ring_reads.push(crate::storage::uring::ReadAt {
                fd: file.as_raw_fd(),
                offset,
                buf: buf.as_mut(),
            });
            which.push(i);
        }
    }
    if ring_reads.is_empty() {
        return;
    }
    // On failure the error names only the first failed read; the others may or may
    // not be whole, so none is kept.
    if crate::storage::uring::submit_reads(false, &mut ring_reads).is_ok() {
        drop(ring_reads);
        for i in which {
            reads[i].set_done();
        }
    }
}

/// Reads ahead, in rounds of one io_uring batch each, the device records that `count`
/// operations of a thread that holds `guard` will need, and then sets `batch` to answer
/// from those bytes and read any other record on the spot. `look(guard, i)` runs the
/// reading part of operation `i` under `guard` made batched over `batch`
/// ([`EpochGuard::batched`]), stopping at the first record not yet read as a batched
/// operation does; its other errors are ignored (the operation meets them again when it
/// runs). The operations then run under `guard.batched(batch)` and wait only for what
/// the look-ahead did not foresee. For compaction, whose chunk reads would otherwise go
/// one at a time. The thread is unprotected while the reads run, as between the rounds
/// of a batch: the caller holds nothing borrowed from `guard` across the call.
pub(crate) fn read_ahead(
    guard: &mut EpochGuard<'_, '_>,
    batch: &ReadBatch,
    count: usize,
    look: impl Fn(&EpochGuard<'_, '_>, usize) -> Result<()>,
) -> ReadAhead {
    let mut open: Vec<usize> = (0..count).collect();
    let mut done = ReadAhead::default();
    for _ in 0..MAX_ROUNDS {
        if open.is_empty() {
            break;
        }
        let mut reads = {
            let batched = guard.batched(batch);
            open.retain(|&i| matches!(look(&batched, i), Err(e) if is_pending(&e)));
            batch.issue()
        };
        if reads.is_empty() {
            break;
        }
        // Without the epoch, as `Rounds` reads (the module docs say why that is safe).
        guard.unprotected(|| read_now(&mut reads));
        done.rounds += 1;
        done.reads += reads.len() as u64;
        batch.complete(reads);
    }
    batch.state.lock().blocking_misses = true;
    done
}

/// What [`read_ahead`] did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ReadAhead {
    /// Device reads it put in flight (each round's together).
    pub(crate) reads: u64,
    /// Rounds of them.
    pub(crate) rounds: u64,
}

impl ReadBatch {
    /// Records read on the spot after [`read_ahead`] (not foreseen by its look).
    pub(crate) fn misses(&self) -> u64 {
        self.state.lock().misses
    }

    /// Bytes of the reads this batch keeps.
    pub(crate) fn bytes_held(&self) -> u64 {
        let state = self.state.lock();
        state
            .read
            .values()
            .map(|r| r.bytes.as_ref().len() as u64)
            .sum()
    }
}

/// The operations of one batch, run in rounds (module docs): `op(guard, key)` for each
/// key, answers in the keys' order. For the async read (`hash/aio.rs`).
#[cfg(feature = "tokio-uring")]
pub(crate) struct Rounds<T> {
    answers: Vec<Option<T>>,
    /// The keys whose operation has not finished.
    open: Vec<usize>,
    batch: ReadBatch,
    rounds: usize,
}

#[cfg(feature = "tokio-uring")]
impl<T> Rounds<T> {
    /// Operations for `keys` keys, none run yet.
    pub(crate) fn new(keys: usize) -> Rounds<T> {
        Rounds {
            answers: (0..keys).map(|_| None).collect(),
            open: (0..keys).collect(),
            batch: ReadBatch::default(),
            rounds: 0,
        }
    }

    /// Runs every unfinished operation once under a guard of `handle`'s epoch and
    /// returns the reads they wait for, set up: none when every operation has its
    /// answer. The reads' results go to [`Rounds::complete`] before the next round.
    /// Past [`MAX_ROUNDS`] the operations still open run on the blocking path.
    pub(crate) fn round<K: AsRef<[u8]>>(
        &mut self,
        handle: &mut EpochHandle<'_>,
        keys: &[K],
        op: impl Fn(&EpochGuard<'_, '_>, &[u8]) -> Result<T>,
    ) -> Result<Vec<DeviceRead>> {
        self.rounds += 1;
        if self.rounds > MAX_ROUNDS {
            let guard = handle.protect();
            for &i in &self.open {
                self.answers[i] = Some(op(&guard, keys[i].as_ref())?);
            }
            self.open.clear();
            return Ok(Vec::new());
        }
        let guard = handle.protect_batched(&self.batch);
        let mut still_open = Vec::new();
        for &i in &self.open {
            match op(&guard, keys[i].as_ref()) {
                Ok(answer) => self.answers[i] = Some(answer),
                Err(e) if is_pending(&e) => still_open.push(i),
                Err(e) => return Err(e),
            }
        }
        self.open = still_open;
        let reads = self.batch.issue();
        drop(guard);
        Ok(reads)
    }

    /// Hands the reads of the last round, done or not, to the next.
    pub(crate) fn complete(&mut self, reads: Vec<DeviceRead>) {
        self.batch.complete(reads);
    }

    /// The answers, once [`Rounds::round`] returned no reads.
    pub(crate) fn answers(self) -> Vec<T> {
        self.answers
            .into_iter()
            .map(|a| a.expect("every operation finished"))
            .collect()
    }
}

/// What [`pipelined`] did, for the store's counters.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Pipelined {
    /// Device reads it put in the thread's window.
    pub(crate) reads: u64,
    /// Times it waited for the device.
    pub(crate) waits: u64,
    /// The reads in the window at each wait, summed: `in_flight / waits` is the mean
    /// queue depth the batch kept.
    pub(crate) in_flight: u64,
}

/// A read in the window, by the record it is for: where it starts and the operations
/// waiting for it.
struct Flight {
    start: u64,
    ops: Vec<usize>,
}

/// Runs `op(guard, key)` for each key of `keys` with the device reads of all of them
/// in flight together in this thread's [`ReadWindow`], and answers in the keys' order.
///
/// Unlike [`Rounds`], the window never empties while an operation waits: each time a
/// read completes, the operations waiting for it run again at once (from their start,
/// as in a round: the module docs say why) under a batched guard, and the reads they
/// ask for next join the window, submitted with the wait for the next completion in
/// one `io_uring_enter`. An operation run more than [`MAX_ROUNDS`] times takes the
/// blocking path, so a failing read ends in its error and the batch ends. The thread
/// holds no guard while it waits.
pub(crate) fn pipelined<K: AsRef<[u8]>, T>(
    handle: &mut EpochHandle<'_>,
    keys: &[K],
    op: impl Fn(&EpochGuard<'_, '_>, &[u8]) -> Result<T>,
) -> Result<(Vec<T>, Pipelined)> {
    let batch = ReadBatch::default();
    let mut window = ReadWindow::new();
    let mut answers: Vec<Option<T>> = (0..keys.len()).map(|_| None).collect();
    let mut runs = vec![0usize; keys.len()];
    let mut ready: Vec<usize> = (0..keys.len()).rev().collect();
    let mut blocking = Vec::new();
    // The reads in the window by record (log, address); a read's tag is its record's
    // index in `tags`.
    let mut flights: HashMap<(usize, u64), Flight> = HashMap::new();
    let mut tags: Vec<(usize, u64)> = Vec::new();
    let mut done = Pipelined::default();
    loop {
        if !ready.is_empty() {
            let guard = handle.protect_batched(&batch);
            while let Some(i) = ready.pop() {
                runs[i] += 1;
                if runs[i] > MAX_ROUNDS {
                    blocking.push(i);
                    continue;
                }
                batch.state.lock().current = i;
                match op(&guard, keys[i].as_ref()) {
                    Ok(answer) => answers[i] = Some(answer),
                    Err(e) if is_pending(&e) => {}
                    Err(e) => return Err(e),
                }
            }
            let wanted = std::mem::take(&mut batch.state.lock().wanted);
            for want in wanted {
                // A record already in flight: the operation waits for that read (if it
                // needs more bytes than it brings, it asks again after).
                if let Some(flight) = flights.get_mut(&(want.log, want.address)) {
                    flight.ops.push(want.op);
                    continue;
                }
                let mut buf = AlignedBuf::new(want.len);
                let Some((file, offset)) = want.device.read_target(want.start, want.len) else {
                    // A device without files: read here, under the guard (a failed
                    // read is not kept: the operation asks again).
                    if want.device.read(want.start, buf.as_mut()).is_ok() {
                        batch.keep(want.log, want.address, want.start, buf);
                    }
                    done.reads += 1;
                    ready.push(want.op);
                    continue;
                };
                flights.insert(
                    (want.log, want.address),
                    Flight {
                        start: want.start,
                        ops: vec![want.op],
                    },
                );
                window.add(file, offset, buf, tags.len() as u64);
                tags.push((want.log, want.address));
                done.reads += 1;
            }
        }
        if !blocking.is_empty() {
            let guard = handle.protect();
            for i in blocking.drain(..) {
                answers[i] = Some(op(&guard, keys[i].as_ref())?);
            }
        }
        if !ready.is_empty() {
            window.submit();
            continue;
        }
        if window.len() == 0 {
            break;
        }
        done.waits += 1;
        done.in_flight += window.len() as u64;
        // Half the window at a time: the next submission carries as many reads.
        for finished in window.wait(window.len() / 2) {
            let (log, address) = tags[finished.tag as usize];
            let flight = flights
                .remove(&(log, address))
                .expect("a read of this batch");
            if finished.result.is_ok() {
                batch.keep(log, address, flight.start, finished.buf);
            }
            ready.extend(flight.ops);
        }
    }
    let answers = answers
        .into_iter()
        .map(|a| a.expect("every operation finished"))
        .collect();
    Ok((answers, done))
}

impl ReadBatch {
    /// Keeps `bytes`, read at `start` of log `log`'s device for the record at
    /// `address`, for the operations that run next.
    fn keep(&self, log: usize, address: u64, start: u64, bytes: AlignedBuf) {
        self.state.lock().read.insert(
            (log, address),
            ReadBytes {
                start,
                bytes,
                counted: false,
            },
        );
    }
}
