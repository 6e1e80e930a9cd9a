//! Appending to the log with group commit.
//!
//! Writers append framed records to an in-memory tail under one short mutex, each taking
//! the next sequence number, and return at once; a writer that must be durable then
//! waits for its sequence number. A waiter that finds records not yet taken, and no group
//! being written, becomes the *leader*: it takes every record appended so far as one
//! *group*, reserves the group's blocks, and — outside the mutex — packs the records into
//! blocks, writes them with one call and syncs the segment. At most one group is being
//! written or synced at a time: writers that arrive meanwhile queue up, and when the sync
//! returns, every writer the group covers is released together and the next leader takes
//! everything that queued during it as one group. (An earlier version let up to four
//! groups be in flight, as SpanDB's parallel log writers do; on a disk whose concurrent
//! `fdatasync`s do not overlap, that made groups small — about two writes per sync at 16
//! threads — for no gain. See `docs/design.md`.)
//!
//! A group always starts a fresh block, and its last block is padded: a block that holds
//! durable records is never written again, because a crash during a rewrite could tear
//! it (atomic writes are not assumed). A group never spans two segments; when the
//! current segment has too few blocks left, the leader starts the next segment first.
//!
//! After a failed write or sync the log is poisoned: every waiter and every later append
//! gets the error, since what reached the disk is unknown.

use std::io;
use std::sync::Arc;

use super::LogPosition;
use super::format::{self, BLOCK_PAYLOAD_BYTES, BlockHeader, LogOp, LogOpRef, SegmentHeader};
use crate::storage::{LOG_BLOCK_BYTES, LogDevice};
// The log is not yet explored by shuttle: it uses parking_lot directly, for its
// condition variable.
use parking_lot::{Condvar, Mutex};

/// How the log is laid out on its device.
#[derive(Clone, Copy, Debug)]
pub struct LogOptions {
    /// Data blocks per segment (4 KiB each); a group larger than a segment gets a
    /// segment of its own size.
    pub segment_blocks: u64,
}

impl Default for LogOptions {
    fn default() -> Self {
        // 16 MiB segments.
        LogOptions {
            segment_blocks: 4096,
        }
    }
}

/// The segment being appended to.
#[derive(Clone, Copy, Debug)]
struct Segment {
    header: SegmentHeader,
    /// The next free block address in it.
    next_block: u64,
}

impl Segment {
    fn end(&self) -> u64 {
        self.header.first_block + self.header.data_blocks
    }
}

struct State {
    /// Framed records appended and not yet taken by a leader, and their end offsets.
    pending: Vec<u8>,
    ends: Vec<usize>,
    /// Sequence number of the next record appended.
    next_seq: u64,
    /// Every record up to this sequence number is durable.
    durable_seq: u64,
    /// Every block below this address is durable.
    durable_block: u64,
    /// A leader is writing or syncing a group: no other group is taken meanwhile.
    writing: bool,
    segment: Option<Segment>,
    next_segment_id: u64,
    failure: Option<String>,
    /// Groups written and synced so far.
    groups_written: u64,
}

/// The write-ahead log (see the module docs).
pub struct Log {
    device: Arc<dyn LogDevice>,
    options: LogOptions,
    state: Mutex<State>,
    durable: Condvar,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("Log")
            .field("next_seq", &s.next_seq)
            .field("durable_seq", &s.durable_seq)
            .finish_non_exhaustive()
    }
}

/// The blocks a leader writes for one group.
struct Group {
    segment: Segment,
    /// Every block below this address was durable when the group was taken.
    durable_horizon: u64,
    /// The group's first block address.
    first_block: u64,
    bytes: Vec<u8>,
    ends: Vec<usize>,
    /// A segment to create before the group is written.
    create: Option<SegmentHeader>,
}

impl Log {
    /// A log on `device` whose next record gets sequence number `next_seq`, starting a
    /// new segment `next_segment_id` at block address `next_block` (the end of what
    /// recovery read, so a segment never continues after a torn block).
    pub fn new(
        device: Arc<dyn LogDevice>,
        options: LogOptions,
        next_seq: u64,
        next_segment_id: u64,
        next_block: u64,
    ) -> Log {
        Log {
            device,
            options,
            state: Mutex::new(State {
                pending: Vec::new(),
                ends: Vec::new(),
                next_seq,
                durable_seq: next_seq.saturating_sub(1),
                durable_block: next_block,
                writing: false,
                segment: None,
                next_segment_id,
                failure: None,
                groups_written: 0,
            }),
            durable: Condvar::new(),
        }
        .with_next_block(next_block)
    }

    fn with_next_block(self, next_block: u64) -> Log {
        {
            let mut s = self.state.lock();
            // A zero-length placeholder: the first group starts a real segment there.
            s.segment = Some(Segment {
                header: SegmentHeader {
                    id: u64::MAX,
                    first_block: next_block,
                    data_blocks: 0,
                },
                next_block,
            });
        }
        self
    }

    /// Appends a record of `ops` and returns its sequence number; nothing waits for the
    /// disk.
    pub fn append(&self, ops: &[LogOp]) -> io::Result<u64> {
        self.append_refs(ops.iter().map(LogOp::as_ref))
    }

    /// Appends a record of borrowed `ops`, as [`Log::append`].
    pub fn append_refs<'a>(
        &self,
        ops: impl ExactSizeIterator<Item = LogOpRef<'a>>,
    ) -> io::Result<u64> {
        let mut s = self.state.lock();
        if let Some(why) = &s.failure {
            return Err(io::Error::other(why.clone()));
        }
        let seq = s.next_seq;
        s.next_seq += 1;
        format::encode_record(seq, ops, &mut s.pending);
        let end = s.pending.len();
        s.ends.push(end);
        Ok(seq)
    }

    /// The log's position now: the sequence number the next record gets, and a block
    /// address no record appended from now on will be written below.
    pub fn position(&self) -> LogPosition {
        let s = self.state.lock();
        LogPosition {
            block: s.segment.map_or(s.durable_block, |seg| seg.next_block),
            seq: s.next_seq,
        }
    }

    /// Removes the segments whose blocks all lie below address `block` (a checkpoint's
    /// position that recovery no longer reads before) and returns how many. The segment
    /// being appended to is never removed, nor a segment whose header does not decode.
    pub fn remove_segments_before(&self, block: u64) -> io::Result<usize> {
        let current = self.state.lock().segment.map(|seg| seg.header.id);
        let mut removed = 0;
        let mut header = vec![0u8; LOG_BLOCK_BYTES];
        for id in self.device.list()? {
            if Some(id) == current {
                continue;
            }
            let n = self.device.read_at(id, 0, &mut header)?;
            let Ok(h) = SegmentHeader::decode(header.get(..n).unwrap_or_default()) else {
                continue;
            };
            if h.id == id && h.first_block.saturating_add(h.data_blocks) <= block {
                self.device.remove(id)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The highest sequence number known durable.
    pub fn durable_seq(&self) -> u64 {
        self.state.lock().durable_seq
    }

    /// The sequence number the next record will get.
    pub fn next_seq(&self) -> u64 {
        self.state.lock().next_seq
    }

    /// How many groups have been written and synced since the log was opened: one
    /// `fdatasync` of a segment each (a segment's creation syncs once more). Records
    /// made durable divided by this is the mean group size.
    pub fn groups_written(&self) -> u64 {
        self.state.lock().groups_written
    }

    /// Waits until every record up to `seq` is durable, leading a group write when no
    /// group is being written and records wait to be taken.
    pub fn wait_durable(&self, seq: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        if seq >= s.next_seq {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "record {seq} was never appended (the next is {})",
                    s.next_seq
                ),
            ));
        }
        loop {
            if let Some(why) = &s.failure {
                return Err(io::Error::other(why.clone()));
            }
            if s.durable_seq >= seq {
                return Ok(());
            }
            // One group at a time: records appended while a group is written wait,
            // and the next leader takes all of them.
            if s.writing || s.pending.is_empty() {
                self.durable.wait(&mut s);
                continue;
            }
            let group = self.take_group(&mut s);
            let last_seq = s.next_seq - 1;
            s.writing = true;
            drop(s);
            let written = self.write_group(&group);
            s = self.state.lock();
            s.writing = false;
            match written {
                Ok(()) => {
                    s.groups_written += 1;
                    s.durable_seq = last_seq;
                    s.durable_block = group.segment.next_block;
                }
                Err(e) => {
                    s.failure = Some(format!("the write-ahead log failed: {e}"));
                }
            }
            self.durable.notify_all();
        }
    }

    /// Makes everything appended so far durable.
    pub fn flush(&self) -> io::Result<()> {
        let last = self.state.lock().next_seq.saturating_sub(1);
        self.wait_durable(last)
    }

    /// Takes the pending records as a group and reserves its blocks (starting a new
    /// segment if the current one has too few left). Called under the state lock.
    fn take_group(&self, s: &mut State) -> Group {
        let bytes = std::mem::take(&mut s.pending);
        let ends = std::mem::take(&mut s.ends);
        let blocks = bytes.len().div_ceil(BLOCK_PAYLOAD_BYTES) as u64;
        let mut segment = s.segment.expect("a log always has a segment");
        let mut create = None;
        if segment.next_block + blocks > segment.end() {
            let header = SegmentHeader {
                id: s.next_segment_id,
                first_block: segment.next_block,
                data_blocks: self.options.segment_blocks.max(blocks),
            };
            s.next_segment_id += 1;
            segment = Segment {
                header,
                next_block: header.first_block,
            };
            create = Some(header);
        }
        let first_block = segment.next_block;
        segment.next_block += blocks;
        s.segment = Some(segment);
        Group {
            segment,
            durable_horizon: s.durable_block,
            first_block,
            bytes,
            ends,
            create,
        }
    }

    /// Writes a group's blocks and syncs its segment, creating the segment first if
    /// needed (the file, then its header written and synced, so that no block of the
    /// segment is written before its header is durable).
    fn write_group(&self, group: &Group) -> io::Result<()> {
        let id = group.segment.header.id;
        if let Some(header) = group.create {
            let len = (header.data_blocks + 1) * LOG_BLOCK_BYTES as u64;
            self.device.create(id, len)?;
            self.device.write_at(id, 0, &header.encode())?;
            self.device.sync(id)?;
        }
        let mut buf =
            Vec::with_capacity(group.bytes.len().div_ceil(BLOCK_PAYLOAD_BYTES) * LOG_BLOCK_BYTES);
        let mut record = 0;
        for (i, payload) in group.bytes.chunks(BLOCK_PAYLOAD_BYTES).enumerate() {
            let start = i * BLOCK_PAYLOAD_BYTES;
            // The record that contains the block's first byte: its bytes before the
            // block's start mean the block begins with a continuation.
            while group.ends.get(record).is_some_and(|&end| end <= start) {
                record += 1;
            }
            let record_start = record
                .checked_sub(1)
                .and_then(|r| group.ends.get(r).copied())
                .unwrap_or(0);
            let continued = if record_start < start {
                group
                    .ends
                    .get(record)
                    .map_or(0, |&end| (end - start).min(payload.len()))
            } else {
                0
            };
            let header = BlockHeader {
                segment: id,
                address: group.first_block + i as u64,
                durable_horizon: group.durable_horizon,
                used: payload.len(),
                continued,
            };
            buf.extend_from_slice(&format::encode_block(&header, payload));
        }
        let offset =
            (group.first_block - group.segment.header.first_block + 1) * LOG_BLOCK_BYTES as u64;
        self.device.write_at(id, offset, &buf)?;
        self.device.sync(id)
    }
}

/// A thread that makes the log's appended records durable within a bounded delay, for
/// writes whose callers do not wait (the "logged" durability level): every `interval`
/// it leads a group write of whatever is pending. Dropping it stops the thread.
pub struct Flusher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Flusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flusher").finish_non_exhaustive()
    }
}

impl Flusher {
    /// Starts flushing `log` every `interval`. A failed flush poisons the log, as any
    /// failed group write does; the thread then stops.
    pub fn start(log: Arc<Log>, interval: std::time::Duration) -> Flusher {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("bfdb-wal-flusher".into())
            .spawn(move || {
                let (stopped, wake) = &*signal;
                let mut stopped = stopped.lock();
                while !*stopped {
                    wake.wait_for(&mut stopped, interval);
                    if *stopped {
                        break;
                    }
                    drop(stopped);
                    let flushed = log.flush();
                    stopped = signal.0.lock();
                    if flushed.is_err() {
                        break;
                    }
                }
            })
            .expect("spawning the log flusher");
        Flusher {
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}
