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
//! current segment has too few blocks left, the leader starts the next segment first:
//! from a *spare* when one is ready (a retired segment, or a file zero-filled ahead of
//! need by a [`Preparer`]), else a newly created file. A spare's every block has been
//! written, so writing and syncing the segment it becomes changes no file system
//! metadata; [`Log::remove_segments_before`] keeps up to [`MAX_SPARE_SEGMENTS`] retired
//! segments as spares instead of deleting them.
//!
//! **Stale blocks.** A spare still holds the blocks of its earlier lives, with valid
//! checksums. Every block carries its segment's id (its tag), and no block of a spare
//! can carry the id of the segment the spare becomes: a spare is named by an id no
//! later segment takes (a retired segment's own id, or one reserved for a fresh spare),
//! every block in a file carries an id at or below the file's name, and a new segment's
//! id is above every id named on the device (`wal::open` starts past the highest segment
//! *and* spare). So the reader sees an old block as stale, the end of the log, whatever
//! its checksum and address say. The new segment's header is written and synced before
//! any of its blocks is written, and the rename into a segment is durable before that.
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

/// Most spare segments kept: retired segments beyond these are deleted. Four 16 MiB
/// segments are what the default checkpoint trigger (64 MiB of log) retires at a time.
pub const MAX_SPARE_SEGMENTS: usize = 4;

/// The longest a leader waits for its group to fill (see [`Log::wait_durable`]).
pub const MAX_GATHER: std::time::Duration = std::time::Duration::from_millis(1);

/// The largest group buffer kept for the next group (a larger one, left by a big
/// batch, is freed).
const MAX_RECYCLED_BYTES: usize = 4 << 20;

/// The id of the placeholder segment a log starts with (no file: the first group
/// starts a real segment where it begins).
const PLACEHOLDER: u64 = u64::MAX;

/// How the log is laid out on its device.
#[derive(Clone, Copy, Debug)]
pub struct LogOptions {
    /// Data blocks per segment (4 KiB each); a group larger than a segment gets a
    /// segment of its own size.
    pub segment_blocks: u64,
    /// How long a leader waits for its group to fill (see [`Log::wait_durable`]):
    /// `None` (the default) for half the last group's write-and-sync time, at most
    /// [`MAX_GATHER`]; `Some(Duration::ZERO)` never waits.
    pub gather_patience: Option<std::time::Duration>,
}

impl Default for LogOptions {
    fn default() -> Self {
        // 16 MiB segments.
        LogOptions {
            segment_blocks: 4096,
            gather_patience: None,
        }
    }
}

impl LogOptions {
    /// The length of a segment file of the usual size (a spare's length), in bytes.
    fn segment_file_bytes(&self) -> u64 {
        (self.segment_blocks + 1) * LOG_BLOCK_BYTES as u64
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

/// The spare segments (see the module docs).
#[derive(Debug, Default)]
struct Spares {
    /// Spares ready to become segments, ascending: each of the usual segment file
    /// length, every block written, named by an id below `State::next_segment_id`.
    ready: Vec<u64>,
    /// A spare is being zero-filled (its id is reserved).
    preparing: bool,
    /// The device keeps no spares.
    unsupported: bool,
    /// The last preparation failed while this segment was current: not retried until
    /// the next segment.
    failed_in: Option<u64>,
    /// The preparer thread is to stop.
    stop: bool,
}

struct State {
    /// Framed records appended and not yet taken by a leader, and their end offsets.
    pending: Vec<u8>,
    ends: Vec<usize>,
    /// The buffers of the last group written, emptied, for the next group's records:
    /// appends then do not grow a fresh buffer step by step under the mutex.
    recycled: (Vec<u8>, Vec<usize>),
    /// Sequence number of the next record appended.
    next_seq: u64,
    /// Every record up to this sequence number is durable.
    durable_seq: u64,
    /// Every block below this address is durable.
    durable_block: u64,
    /// A leader is writing or syncing a group: no other group is taken meanwhile.
    writing: bool,
    segment: Segment,
    /// The id the next segment (or fresh spare) gets: above every id on the device.
    next_segment_id: u64,
    failure: Option<String>,
    /// Groups written and synced so far.
    groups_written: u64,
    spares: Spares,
    /// How the next leader gathers its group (see [`Log::wait_durable`]).
    gather: Gather,
    /// When the first record now pending was appended (in [`Log::clock_nanos`]), and
    /// the oldest append of the group being written: what [`Log::unflushed_for`]
    /// measures from.
    pending_since: Option<u64>,
    group_since: Option<u64>,
}

/// What a leader knows of how many writers wait for syncs, to gather a full group.
#[derive(Debug, Default)]
struct Gather {
    /// Writers waiting for their records to be durable now (not the flusher, nor
    /// `flush` callers).
    waiting: usize,
    /// The most writers waiting at once since the last group was taken.
    peak: usize,
    /// The peak of the interval before that group: how many records the next leader
    /// waits for before it takes its group.
    target: usize,
    /// How long the last group took to write and sync.
    last_write: std::time::Duration,
    /// A leader is gathering: appends wake it when the target is reached.
    leader_waiting: bool,
}

impl State {
    /// Whether the preparer should zero-fill a spare now: none is ready or being made,
    /// and the current segment is half used, so that the next is ready before it is
    /// needed (a log that writes little never makes one).
    fn wants_spare(&self) -> bool {
        let seg = &self.segment;
        !self.spares.unsupported
            && !self.spares.preparing
            && !self.spares.stop
            && self.spares.ready.is_empty()
            && self.failure.is_none()
            && seg.header.id != PLACEHOLDER
            && self.spares.failed_in != Some(seg.header.id)
            && (seg.next_block - seg.header.first_block) * 2 >= seg.header.data_blocks
    }
}

/// The write-ahead log (see the module docs).
pub struct Log {
    device: Arc<dyn LogDevice>,
    options: LogOptions,
    state: Mutex<State>,
    /// Signalled when durability advances, the log fails, or a spare becomes ready.
    durable: Condvar,
    /// Signalled when a gathering leader's group has its target of records.
    gathered: Condvar,
    /// Signalled when the preparer has work (or must stop).
    spare_wanted: Condvar,
    /// The clock's origin, for the times below.
    origin: std::time::Instant,
    /// When the oldest record not yet durable was appended (nanoseconds since
    /// `origin`); `u64::MAX` when every record is durable. Written under the state
    /// lock, read without it by [`Log::unflushed_for`].
    oldest_unflushed_nanos: std::sync::atomic::AtomicU64,
    /// Set once the log failed (the reason is `State::failure`).
    failed: std::sync::atomic::AtomicBool,
    /// Run before each group's blocks are written ([`Log::set_before_group`]).
    before_group: std::sync::OnceLock<BeforeGroup>,
}

/// What must be durable before a group of records is written: the database's value
/// store, whose values the records reference.
type BeforeGroup = Box<dyn Fn() -> io::Result<()> + Send + Sync>;

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("Log")
            .field("next_seq", &s.next_seq)
            .field("durable_seq", &s.durable_seq)
            .finish_non_exhaustive()
    }
}

/// How a group's new segment comes to exist.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// A new file.
    Create(SegmentHeader),
    /// A spare renamed into the segment.
    Reuse { spare: u64, header: SegmentHeader },
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
    /// A segment to start before the group is written.
    start: Option<Start>,
}

impl Log {
    /// A log on `device` whose next record gets sequence number `next_seq`, starting a
    /// new segment `next_segment_id` at block address `next_block` (the end of what
    /// recovery read, so a segment never continues after a torn block).
    /// `next_segment_id` must be above the id of every segment and spare on the device.
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
                recycled: (Vec::new(), Vec::new()),
                next_seq,
                durable_seq: next_seq.saturating_sub(1),
                durable_block: next_block,
                writing: false,
                // A zero-length placeholder: the first group starts a real segment there.
                segment: Segment {
                    header: SegmentHeader {
                        format: format::FORMAT_VERSION,
                        id: PLACEHOLDER,
                        first_block: next_block,
                        data_blocks: 0,
                    },
                    next_block,
                },
                next_segment_id,
                failure: None,
                groups_written: 0,
                spares: Spares::default(),
                gather: Gather::default(),
                pending_since: None,
                group_since: None,
            }),
            durable: Condvar::new(),
            gathered: Condvar::new(),
            spare_wanted: Condvar::new(),
            origin: std::time::Instant::now(),
            oldest_unflushed_nanos: std::sync::atomic::AtomicU64::new(u64::MAX),
            failed: std::sync::atomic::AtomicBool::new(false),
            before_group: std::sync::OnceLock::new(),
        }
    }

    /// Nanoseconds since the log's clock origin.
    fn clock_nanos(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// How long the oldest record not yet durable has waited since its append (zero
    /// when every record is durable). Reads no lock.
    pub fn unflushed_for(&self) -> std::time::Duration {
        use std::sync::atomic::Ordering;
        let since = self.oldest_unflushed_nanos.load(Ordering::Acquire);
        if since == u64::MAX {
            return std::time::Duration::ZERO;
        }
        std::time::Duration::from_nanos(self.clock_nanos().saturating_sub(since))
    }

    /// Waits until record `seq` is durable if the oldest record not yet durable was
    /// appended more than `late` ago (the flusher that should have written it is
    /// behind); returns at once otherwise.
    pub fn wait_if_late(&self, seq: u64, late: std::time::Duration) -> io::Result<()> {
        if self.unflushed_for() > late {
            self.wait_durable(seq)
        } else {
            Ok(())
        }
    }

    /// Publishes when the oldest record not yet durable was appended.
    fn publish_unflushed(&self, s: &State) {
        use std::sync::atomic::Ordering;
        let oldest = s.group_since.or(s.pending_since).unwrap_or(u64::MAX);
        self.oldest_unflushed_nanos.store(oldest, Ordering::Release);
    }

    /// Fails the log for `why` (one of its threads died): every waiter and every later
    /// append gets the error.
    pub(crate) fn fail(&self, why: String) {
        let mut s = self.state.lock();
        s.failure.get_or_insert(why);
        self.failed
            .store(true, std::sync::atomic::Ordering::Release);
        drop(s);
        self.durable.notify_all();
    }

    /// Why the log failed, if it did: after a failed write or sync it takes no more
    /// records.
    pub fn failure(&self) -> Option<String> {
        if !self.failed.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        self.state.lock().failure.clone()
    }

    /// Adopts spares found on the device (ids below the log's next segment id, each of
    /// the usual segment file length).
    pub(crate) fn adopt_spares(&self, ids: Vec<u64>) {
        let mut s = self.state.lock();
        debug_assert!(ids.iter().all(|&id| id < s.next_segment_id));
        s.spares.ready = ids;
        s.spares.ready.sort_unstable();
    }

    /// Appends a record of `ops` and returns its sequence number; nothing waits for the
    /// disk.
    pub fn append(&self, ops: &[LogOp]) -> io::Result<u64> {
        self.append_refs(ops.iter().map(LogOp::as_ref))
    }

    /// Appends a record of borrowed `ops`, as [`Log::append`].
    pub fn append_refs<'a>(
        &self,
        ops: impl ExactSizeIterator<Item = LogOpRef<'a>> + Clone,
    ) -> io::Result<u64> {
        let mut s = self.state.lock();
        if let Some(why) = &s.failure {
            return Err(io::Error::other(why.clone()));
        }
        let seq = s.next_seq;
        s.next_seq += 1;
        if s.ends.is_empty() {
            s.pending_since = Some(self.clock_nanos());
            if s.group_since.is_none() {
                self.publish_unflushed(&s);
            }
        }
        format::encode_record(seq, ops, &mut s.pending);
        let end = s.pending.len();
        s.ends.push(end);
        if s.gather.leader_waiting && s.ends.len() >= s.gather.target {
            self.gathered.notify_one();
        }
        Ok(seq)
    }

    /// The log's position now: the sequence number the next record gets, and a block
    /// address no record appended from now on will be written below.
    pub fn position(&self) -> LogPosition {
        let s = self.state.lock();
        LogPosition {
            block: s.segment.next_block,
            seq: s.next_seq,
        }
    }

    /// Retires the segments whose blocks all lie below address `block` (a checkpoint's
    /// position that recovery no longer reads before) and returns how many. Up to
    /// [`MAX_SPARE_SEGMENTS`] of the usual size are kept as spares, to become later
    /// segments; the others are removed. The segment being appended to is never
    /// retired, nor a segment whose header does not decode.
    ///
    /// A retired segment is never one recovery could still need: recovery reads from
    /// `block` or a later position, and skips every segment wholly below where it
    /// starts; a spare is not read at all, and its old blocks are stale to the segment
    /// it becomes (see the module docs).
    pub fn remove_segments_before(&self, block: u64) -> io::Result<usize> {
        let current = self.state.lock().segment.header.id;
        let mut removed = 0;
        let mut header = vec![0u8; LOG_BLOCK_BYTES];
        for id in self.device.list()? {
            if id == current {
                continue;
            }
            let n = self.device.read_at(id, 0, &mut header)?;
            let Ok(h) = SegmentHeader::decode(header.get(..n).unwrap_or_default()) else {
                continue;
            };
            if h.id != id || h.first_block.saturating_add(h.data_blocks) > block {
                continue;
            }
            let keep = h.data_blocks == self.options.segment_blocks && {
                let s = self.state.lock();
                !s.spares.unsupported
                    && s.spares.ready.len() + usize::from(s.spares.preparing) < MAX_SPARE_SEGMENTS
            };
            if keep {
                match self.device.retire(id) {
                    Ok(()) => {
                        let mut s = self.state.lock();
                        s.spares.ready.push(id);
                        s.spares.ready.sort_unstable();
                        drop(s);
                        // A leader may be waiting for a spare.
                        self.durable.notify_all();
                    }
                    Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                        self.state.lock().spares.unsupported = true;
                        self.device.remove(id)?;
                    }
                    Err(e) => return Err(e),
                }
            } else {
                self.device.remove(id)?;
            }
            removed += 1;
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
    /// `fdatasync` of a segment each (a segment's start syncs once more). Records
    /// made durable divided by this is the mean group size.
    pub fn groups_written(&self) -> u64 {
        self.state.lock().groups_written
    }

    /// How many spare segments are ready to become segments.
    pub fn spare_segments(&self) -> usize {
        self.state.lock().spares.ready.len()
    }

    /// Waits until every record up to `seq` is durable, leading a group write when no
    /// group is being written and records wait to be taken.
    ///
    /// **Gathering.** With one group at a time, the writers a sync releases append their
    /// next records while the group that queued during that sync is already being
    /// written, so concurrent writers split into two alternating half-size groups. A
    /// leader therefore first waits, up to half the last group's write-and-sync time
    /// (at most [`MAX_GATHER`]), until as many records are pending as writers were
    /// waiting at once during the previous group: the released writers join its group
    /// instead of the next. A lone writer's target is itself, so it never waits.
    pub fn wait_durable(&self, seq: u64) -> io::Result<()> {
        self.wait(seq, true)
    }

    /// [`Log::wait_durable`]; `counted` if the caller is a writer that waits for its
    /// own record (it counts toward a gathering leader's target).
    fn wait(&self, seq: u64, counted: bool) -> io::Result<()> {
        let mut s = self.state.lock();
        if counted {
            let g = &mut s.gather;
            g.waiting += 1;
            g.peak = g.peak.max(g.waiting);
        }
        let out = self.wait_locked(&mut s, seq);
        if counted {
            s.gather.waiting -= 1;
        }
        out
    }

    fn wait_locked(&self, s: &mut parking_lot::MutexGuard<'_, State>, seq: u64) -> io::Result<()> {
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
            // and the next leader takes all of them. A group that must start a new
            // segment waits for a spare being zero-filled rather than create a file
            // whose first writes change metadata.
            if s.writing
                || s.pending.is_empty()
                || (s.spares.preparing && s.spares.ready.is_empty() && self.needs_segment(s))
            {
                self.durable.wait(s);
                continue;
            }
            // Leading: no other leader starts while this one gathers or writes.
            s.writing = true;
            self.gather(s);
            let group = self.take_group(s);
            let last_seq = s.next_seq - 1;
            let started = std::time::Instant::now();
            let written = parking_lot::MutexGuard::unlocked(s, || self.write_group(&group));
            s.gather.last_write = started.elapsed();
            s.writing = false;
            match written {
                Ok(()) => {
                    s.groups_written += 1;
                    s.durable_seq = last_seq;
                    s.durable_block = group.segment.next_block;
                    if group.bytes.capacity() <= MAX_RECYCLED_BYTES {
                        let (mut bytes, mut ends) = (group.bytes, group.ends);
                        bytes.clear();
                        ends.clear();
                        s.recycled = (bytes, ends);
                    }
                }
                Err(e) => {
                    s.failure = Some(format!("the write-ahead log failed: {e}"));
                    self.failed
                        .store(true, std::sync::atomic::Ordering::Release);
                }
            }
            s.group_since = None;
            self.publish_unflushed(s);
            if s.wants_spare() {
                self.spare_wanted.notify_one();
            }
            self.durable.notify_all();
        }
    }

    /// Sets what runs before every group's blocks are written (once; later calls are
    /// ignored): a database syncs its value store there, so that no log record that
    /// references a value is durable before the value. An error fails the group, and
    /// so the log, as a failed write of its own blocks does.
    pub(crate) fn set_before_group(&self, before: BeforeGroup) {
        let _ = self.before_group.set(before);
    }

    /// Makes everything appended so far durable.
    pub fn flush(&self) -> io::Result<()> {
        let last = self.state.lock().next_seq.saturating_sub(1);
        self.wait(last, false)
    }

    /// A leader's wait for its group to fill (see [`Log::wait_durable`]): until as many
    /// records are pending as writers waited at once during the previous group, or
    /// half the last group's write time has passed, or the log failed. Then sets the
    /// next leader's target. Called under the state lock, by the leader.
    fn gather(&self, s: &mut parking_lot::MutexGuard<'_, State>) {
        let patience = self
            .options
            .gather_patience
            .unwrap_or((s.gather.last_write / 2).min(MAX_GATHER));
        if s.ends.len() < s.gather.target && !patience.is_zero() {
            let deadline = std::time::Instant::now() + patience;
            s.gather.leader_waiting = true;
            while s.ends.len() < s.gather.target
                && s.failure.is_none()
                && !self.gathered.wait_until(s, deadline).timed_out()
            {}
            s.gather.leader_waiting = false;
        }
        let g = &mut s.gather;
        g.target = g.peak;
        g.peak = g.waiting;
    }

    /// Whether the pending records do not fit in the current segment.
    fn needs_segment(&self, s: &State) -> bool {
        let blocks = s.pending.len().div_ceil(BLOCK_PAYLOAD_BYTES) as u64;
        s.segment.next_block + blocks > s.segment.end()
    }

    /// Takes the pending records as a group and reserves its blocks (starting a new
    /// segment if the current one has too few left). Called under the state lock.
    fn take_group(&self, s: &mut State) -> Group {
        let (spare_bytes, spare_ends) = std::mem::take(&mut s.recycled);
        s.group_since = s.pending_since.take();
        let bytes = std::mem::replace(&mut s.pending, spare_bytes);
        let ends = std::mem::replace(&mut s.ends, spare_ends);
        let blocks = bytes.len().div_ceil(BLOCK_PAYLOAD_BYTES) as u64;
        let mut segment = s.segment;
        let mut start = None;
        if segment.next_block + blocks > segment.end() {
            let header = SegmentHeader {
                format: format::FORMAT_VERSION,
                id: s.next_segment_id,
                first_block: segment.next_block,
                data_blocks: self.options.segment_blocks.max(blocks),
            };
            s.next_segment_id += 1;
            segment = Segment {
                header,
                next_block: header.first_block,
            };
            // Spares are all of the usual size; a larger group gets a file of its own.
            let spare = if header.data_blocks == self.options.segment_blocks
                && !s.spares.ready.is_empty()
            {
                Some(s.spares.ready.remove(0))
            } else {
                None
            };
            start = Some(match spare {
                Some(spare) => Start::Reuse { spare, header },
                None => Start::Create(header),
            });
        }
        let first_block = segment.next_block;
        segment.next_block += blocks;
        s.segment = segment;
        Group {
            segment,
            durable_horizon: s.durable_block,
            first_block,
            bytes,
            ends,
            start,
        }
    }

    /// Writes a group's blocks and syncs its segment, starting the segment first if
    /// needed: the file created or the spare renamed, then its header written and
    /// synced, so that no block of the segment is written before its header is durable.
    fn write_group(&self, group: &Group) -> io::Result<()> {
        // The WAL rule for what the records reference: a value's bytes are durable
        // before any record naming it can be.
        if let Some(before) = self.before_group.get() {
            before()?;
        }
        let id = group.segment.header.id;
        if let Some(start) = group.start {
            let header = match start {
                Start::Create(header) => {
                    let len = (header.data_blocks + 1) * LOG_BLOCK_BYTES as u64;
                    self.device.create(id, len)?;
                    header
                }
                Start::Reuse { spare, header } => {
                    self.device.reuse(spare, id)?;
                    header
                }
            };
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

    /// Zero-fills one spare segment now, unless [`MAX_SPARE_SEGMENTS`] are ready or one
    /// is being made; returns whether it made one. (A [`Preparer`] does this in the
    /// background when the log will soon need one.) A device that keeps no spares
    /// answers `Ok(false)`.
    pub fn prepare_spare(&self) -> io::Result<bool> {
        let id = {
            let mut s = self.state.lock();
            if s.spares.unsupported
                || s.spares.preparing
                || s.spares.ready.len() >= MAX_SPARE_SEGMENTS
            {
                return Ok(false);
            }
            self.reserve_spare(&mut s)
        };
        let made = self
            .device
            .create_spare(id, self.options.segment_file_bytes());
        self.spare_made(id, made.as_ref().map(|_| ()).map_err(io::Error::kind));
        match made {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Reserves an id for a spare being made. Called under the state lock.
    fn reserve_spare(&self, s: &mut State) -> u64 {
        let id = s.next_segment_id;
        s.next_segment_id += 1;
        s.spares.preparing = true;
        id
    }

    /// Records the end of a spare's preparation.
    fn spare_made(&self, id: u64, made: Result<(), io::ErrorKind>) {
        let mut s = self.state.lock();
        s.spares.preparing = false;
        match made {
            Ok(()) => {
                s.spares.ready.push(id);
                s.spares.ready.sort_unstable();
            }
            Err(io::ErrorKind::Unsupported) => s.spares.unsupported = true,
            Err(_) => s.spares.failed_in = Some(s.segment.header.id),
        }
        drop(s);
        // A leader may be waiting for this spare.
        self.durable.notify_all();
    }

    /// The preparer thread's loop: waits until the log wants a spare, makes it, and
    /// goes on until told to stop.
    fn prepare_spares(&self) {
        loop {
            let id = {
                let mut s = self.state.lock();
                while !s.spares.stop && !s.wants_spare() {
                    self.spare_wanted.wait(&mut s);
                }
                if s.spares.stop {
                    return;
                }
                self.reserve_spare(&mut s)
            };
            let made = self
                .device
                .create_spare(id, self.options.segment_file_bytes());
            if let Err(e) = &made
                && e.kind() != io::ErrorKind::Unsupported
            {
                log::warn!(
                    "bfdb: preparing a spare log segment failed (the next segment is \
                     created instead): {e}"
                );
            }
            self.spare_made(id, made.map_err(|e| e.kind()));
        }
    }

    /// Tells the preparer thread to stop.
    fn stop_preparing(&self) {
        self.state.lock().spares.stop = true;
        self.spare_wanted.notify_all();
    }
}

/// A thread that zero-fills the log's next segment ahead of need: once the current
/// segment is half used and no spare is ready, it makes one ([`Log::prepare_spare`]),
/// so that the segment after it is a file whose blocks are all written. A leader that
/// must start a segment while a spare is being made waits for it. Dropping the
/// preparer stops its thread (after the spare in progress, if any).
pub struct Preparer {
    log: Arc<Log>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Preparer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Preparer").finish_non_exhaustive()
    }
}

impl Preparer {
    /// Starts preparing spares for `log`.
    pub fn start(log: Arc<Log>) -> Preparer {
        let worker = Arc::clone(&log);
        let handle = std::thread::Builder::new()
            .name("bfdb-wal-spares".into())
            .spawn(move || {
                let prepared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    worker.prepare_spares();
                }));
                if let Err(panic) = prepared {
                    worker.fail(format!(
                        "the log's spare preparer panicked: {}",
                        crate::ticker::panic_message(&*panic)
                    ));
                }
            })
            .expect("spawning the log's spare preparer");
        Preparer {
            log,
            handle: Some(handle),
        }
    }
}

impl Drop for Preparer {
    fn drop(&mut self) {
        self.log.stop_preparing();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
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
                    let flushed =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| log.flush()))
                            .unwrap_or_else(|panic| {
                                let why = format!(
                                    "the log's flusher panicked: {}",
                                    crate::ticker::panic_message(&*panic)
                                );
                                log.fail(why.clone());
                                Err(io::Error::other(why))
                            });
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
