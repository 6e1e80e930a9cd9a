//! The HybridLog (FASTER, SIGMOD 2018, sections 5 and 6): one logical address space
//! over a circular buffer of in-memory page frames and a disk ([`BlockDevice`]).
//!
//! ```text
//!   BEGIN        HEAD        SAFE_READ_ONLY   READ_ONLY            TAIL
//!     │ on disk    │  in memory, read-only │ fuzzy │ mutable (in place) │
//!     ▼            ▼                       ▼       ▼                    ▼
//! ────┴────────────┴───────────────────────┴───────┴────────────────────┴────▶ address
//! ```
//!
//! - **Addresses** are 48-bit logical addresses, `page << page_bits | offset`; 0 is no
//!   address (page 0 starts at [`FIRST_ADDRESS`]). Page `p` lives in frame
//!   `p % frames` while it is at or above HEAD.
//! - **Allocation** at TAIL is a fetch-and-add on a word holding (page, offset). An add
//!   that runs past the page's end gets nothing; its thread drops what it holds, and it
//!   (with any other such thread) moves the tail to the next page once that page's frame
//!   is free, refreshing its epoch between tries (FASTER's `Allocate` / `NewPage`). The
//!   unused end of a page stays zero, which no record header is, so a scan knows where a
//!   page's records end.
//! - **Opening page `q`** moves READ_ONLY to the start of page `q - mutable_pages` and,
//!   if frame `q % frames` still holds page `q - frames`, moves HEAD past that page once
//!   it is flushed, then waits for it to be closed.
//! - **Flush and close through epoch triggers.** Moving READ_ONLY bumps the epoch with an
//!   action that, once every thread has refreshed (so no thread can still be updating a
//!   record below it in place), sets SAFE_READ_ONLY and writes the pages below it to the
//!   device. Moving HEAD (only ever to an address already flushed) bumps the epoch with an
//!   action that, once no thread can still read those frames, zeroes them for reuse.
//! - **Regions.** A record at or above READ_ONLY may be updated in place; between
//!   SAFE_READ_ONLY and READ_ONLY (the fuzzy region) some thread may still do so, so a
//!   read-modify-write must not copy it yet; below SAFE_READ_ONLY a copy goes to the
//!   tail; below HEAD the record is read from the device; below BEGIN it is gone.
//!
//! Invariants this module owns:
//! - `BEGIN <= HEAD <= SAFE_READ_ONLY <= READ_ONLY <= TAIL` (BEGIN may pass HEAD only in
//!   a truncation, which is then also a truncation of memory), and
//!   `closed_until <= HEAD <= flushed_until`: a frame is zeroed only after its page is on
//!   the device, and only after every thread that could read it has refreshed.
//! - A frame is reused for page `p` only after page `p - frames` was closed.
//! - After a device error the log is failed: allocation returns the error (nothing
//!   waits forever for a flush that will not come).
//! - Every record on the device carries its checksum (stamped on the flush's copy of
//!   its page, see [`super::record`]), and every record decoded from device bytes is
//!   checked: damage is an error naming the file and the address, never a value.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;
// Frame words are raw memory: `std` atomics over it (see `crate::sync`).
use std::sync::atomic::AtomicU64 as AtomicU64Std;

use super::epoch::{Epoch, EpochGuard};
use super::record::{Decode, DiskRecord, MemRecord, stamp_checksums};
use crate::error::{Error, Result};
use crate::storage::{AlignedBuf, BlockDevice, IO_ALIGN_BYTES};
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::backoff_wait;

/// The first address of a log: page 0's first 64 bytes are never used, so 0 can mean
/// "no address".
pub(crate) const FIRST_ADDRESS: u64 = 64;

/// The largest address: 48 bits.
pub(crate) const MAX_ADDRESS: u64 = (1 << 48) - 1;

/// How a hybrid log is laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HlogOptions {
    /// log2 of the page size (at least 12: pages are written with O_DIRECT).
    pub(crate) page_bits: u32,
    /// Page frames in memory (at least 2).
    pub(crate) frames: u64,
    /// Pages below TAIL's page that stay mutable (at most `frames - 1`). FASTER's
    /// default is 90% of the frames.
    pub(crate) mutable_pages: u64,
}

impl HlogOptions {
    /// `memory_bytes` of frames of `1 << page_bits` bytes (at least two), 90% mutable.
    pub(crate) fn with_memory(memory_bytes: u64, page_bits: u32) -> HlogOptions {
        let frames = (memory_bytes >> page_bits).max(2);
        HlogOptions {
            page_bits,
            frames,
            mutable_pages: (frames * 9 / 10).clamp(1, frames - 1),
        }
    }

    fn validate(&self) -> Result<()> {
        let ok = (12..=30).contains(&self.page_bits)
            && self.frames >= 2
            && (1..self.frames).contains(&self.mutable_pages);
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidConfig(format!(
                "hybrid log: pages of 2^12..2^30 bytes, at least 2 frames, 1..frames \
                 mutable pages; got {self:?}"
            )))
        }
    }
}

/// The page frames: `frames` buffers of one page each, aligned for O_DIRECT.
struct Frames {
    ptrs: Vec<NonNull<u8>>,
    layout: Layout,
}

// SAFETY: the frames are plain memory owned by this struct; who may touch which bytes is
// governed by the log's protocol (allocation, epochs), not by the pointers.
unsafe impl Send for Frames {}
// SAFETY: as above.
unsafe impl Sync for Frames {}

impl Frames {
    fn new(count: u64, page_bytes: usize) -> Frames {
        let layout = Layout::from_size_align(page_bytes, IO_ALIGN_BYTES as usize)
            .expect("a page size validated by HlogOptions");
        let ptrs = (0..count)
            .map(|_| {
                // SAFETY: the layout has a non-zero size.
                let ptr = unsafe { alloc_zeroed(layout) };
                NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
            })
            .collect();
        Frames { ptrs, layout }
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        for ptr in &self.ptrs {
            // SAFETY: allocated in `new` with this layout, freed once.
            unsafe { dealloc(ptr.as_ptr(), self.layout) };
        }
    }
}

/// Bytes a read of one record from the device asks for at first (from the record's
/// start): a hash chunk (280 bytes) or a record of a 100-byte value and a short key
/// fits, so it takes one read of one or two sectors.
pub(crate) const FIRST_READ_BYTES: u64 = 512;

/// The records of part of one page, decoded one at a time ([`HybridLog::records_in`]):
/// no list of them is built, so a compaction of 4 MiB pages takes no large allocation
/// but its page buffer.
pub(crate) struct PageRecords {
    page: u64,
    bytes: AlignedBuf,
    at: usize,
    until: u64,
    /// Read from the device: each record's checksum is checked.
    from_device: bool,
    shared: Arc<Shared>,
}

impl Iterator for PageRecords {
    type Item = Result<(u64, DiskRecord)>;

    fn next(&mut self) -> Option<Self::Item> {
        let bytes = self.bytes.as_ref();
        let (page, at) = (self.page, self.at);
        if page + at as u64 >= self.until || at >= bytes.len() {
            return None;
        }
        let decoded = if self.from_device {
            DiskRecord::decode(&bytes[at..], bytes.len() - at)
        } else {
            DiskRecord::decode_in_memory(&bytes[at..], bytes.len() - at)
        };
        match decoded {
            Ok(record) => {
                self.at += super::record::record_size_bytes(record.key.len(), record.value.len());
                Some(Ok((page + at as u64, record)))
            }
            // The zero end of the page.
            Err(_) if bytes[at..].iter().take(8).all(|&b| b == 0) => {
                self.at = bytes.len();
                None
            }
            Err(e) => {
                self.at = bytes.len();
                let why = match e {
                    Decode::Corrupt(why) => why,
                    Decode::NeedBytes(_) => "a record cut short".into(),
                };
                Some(Err(self.shared.corrupt(page + at as u64, &why)))
            }
        }
    }
}

/// The log's state, shared with the trigger actions it registers.
struct Shared {
    options: HlogOptions,
    page_bytes: u64,
    frames: Frames,
    device: Arc<dyn BlockDevice>,
    /// `page << 32 | offset` of the next allocation. The offset may run past the page's
    /// end while the next page is being opened.
    tail: AtomicU64,
    read_only: AtomicU64,
    safe_read_only: AtomicU64,
    head: AtomicU64,
    safe_head: AtomicU64,
    begin: AtomicU64,
    /// Every page below this address is on the device.
    flushed_until: AtomicU64,
    /// Every frame of a page below this address is zeroed and free.
    closed_until: AtomicU64,
    /// Serialize flushes and closes (each in address order).
    flushing: Mutex<()>,
    closing: Mutex<()>,
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    /// Records read from the device (see [`HybridLog::record_reads`]).
    record_reads: AtomicU64,
    /// One bit for each 8 bytes of every frame: set when the record starting there was
    /// read while in memory ([`HybridLog::note_read`]); a frame's bits are cleared with
    /// it. Empty unless the log tracks reads ([`HybridLog::tracking_reads`]).
    read_bits: Box<[AtomicU64Std]>,
    /// The pages below this address were handed to the `leaving` hook of
    /// [`HybridLog::new_page_leaving`] (each page once).
    left_until: AtomicU64,
}

/// A hybrid log. Operations on it run under a guard of its epoch ([`HybridLog::epoch`]).
pub(crate) struct HybridLog {
    shared: Arc<Shared>,
    epoch: Arc<Epoch>,
}

/// What [`HybridLog::allocate`] got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Alloc {
    /// The space at this address is the caller's.
    At(u64),
    /// The tail's page (this one) is full: see [`HybridLog::allocate`].
    PageFull(u64),
}

/// Where a record is.
pub(crate) enum Fetched {
    /// In a page frame, at or above HEAD: usable until the guard refreshes.
    Memory(MemRecord),
    /// Read from the device.
    Disk(DiskRecord),
}

/// The part of a log a checkpoint holds: its records `[begin, tail)`, on the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LogExtent {
    pub(crate) begin: u64,
    pub(crate) tail: u64,
}

/// The log's addresses at one moment (loaded from the oldest up, so the order holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Addresses {
    pub(crate) begin: u64,
    pub(crate) head: u64,
    pub(crate) safe_read_only: u64,
    pub(crate) read_only: u64,
    pub(crate) tail: u64,
    pub(crate) flushed_until: u64,
}

impl HybridLog {
    /// An empty log over `device`, coordinated by `epoch`.
    pub(crate) fn new(
        options: HlogOptions,
        device: Arc<dyn BlockDevice>,
        epoch: Arc<Epoch>,
    ) -> Result<HybridLog> {
        options.validate()?;
        let page_bytes = 1u64 << options.page_bits;
        Ok(HybridLog {
            shared: Arc::new(Shared {
                options,
                page_bytes,
                frames: Frames::new(options.frames, page_bytes as usize),
                device,
                tail: AtomicU64::new(FIRST_ADDRESS),
                read_only: AtomicU64::new(0),
                safe_read_only: AtomicU64::new(0),
                head: AtomicU64::new(0),
                safe_head: AtomicU64::new(0),
                begin: AtomicU64::new(FIRST_ADDRESS),
                flushed_until: AtomicU64::new(0),
                closed_until: AtomicU64::new(0),
                flushing: Mutex::new(()),
                closing: Mutex::new(()),
                failed: AtomicBool::new(false),
                failure: Mutex::new(None),
                record_reads: AtomicU64::new(0),
                read_bits: Box::new([]),
                left_until: AtomicU64::new(0),
            }),
            epoch,
        })
    }

    /// This new log, keeping a bit per 8 bytes of its frames (a sixty-fourth of their
    /// memory) that says which records were read while in memory, if `on`.
    pub(crate) fn tracking_reads(mut self, on: bool) -> HybridLog {
        if on {
            let s = Arc::get_mut(&mut self.shared).expect("a log nobody shares yet");
            let words = (s.options.frames * s.page_bytes / 8).div_ceil(64);
            s.read_bits = (0..words).map(|_| AtomicU64Std::new(0)).collect();
        }
        self
    }

    /// The word and bit of `address`'s read bit, if the log tracks reads.
    fn read_bit(&self, address: u64) -> Option<(&AtomicU64Std, u64)> {
        let s = &self.shared;
        if s.read_bits.is_empty() {
            return None;
        }
        let frame = (address >> s.options.page_bits) % s.options.frames;
        let bit = (frame * s.page_bytes + (address & (s.page_bytes - 1))) / 8;
        Some((&s.read_bits[(bit / 64) as usize], 1 << (bit % 64)))
    }

    /// Notes that the record at `address`, at or above HEAD as this protected thread
    /// saw it, was read (if the log tracks reads). The bit is cleared when the frame is
    /// closed, which waits for this thread to refresh, so it never outlives its page.
    pub(crate) fn note_read(&self, address: u64) {
        if let Some((word, bit)) = self.read_bit(address)
            && word.load(std::sync::atomic::Ordering::Relaxed) & bit == 0
        {
            word.fetch_or(bit, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The addresses of the records of the page at `page` (page-aligned, in its frame)
    /// that were read while in memory, in address order: its frame's set read bits, each
    /// at a record's start ([`HybridLog::note_read`] is given only those). Empty if the
    /// log does not track reads.
    pub(crate) fn read_records_of(&self, page: u64) -> Vec<u64> {
        let mut read = Vec::new();
        for (i, word) in self.shared.read_bits_of(page).iter().enumerate() {
            let mut bits = word.load(std::sync::atomic::Ordering::Relaxed);
            while bits != 0 {
                let bit = u64::from(bits.trailing_zeros());
                read.push(page + (i as u64 * 64 + bit) * 8);
                bits &= bits - 1;
            }
        }
        read
    }

    /// The log a checkpoint captured as `extent` on `device`: its records `[begin,
    /// tail)` are on the device (a checkpoint flushed and synced them). The tail's page
    /// is read back into its frame up to `tail` — bytes at and past `tail` on the device
    /// were written after the checkpoint and are not part of it — and appends go on at
    /// `tail`. Everything below is read-only: the checkpoint's records never change.
    pub(crate) fn recover(
        options: HlogOptions,
        device: Arc<dyn BlockDevice>,
        epoch: Arc<Epoch>,
        extent: LogExtent,
    ) -> Result<HybridLog> {
        let log = HybridLog::new(options, device, epoch)?;
        let s = &log.shared;
        let LogExtent { begin, tail } = extent;
        if begin < FIRST_ADDRESS || begin > tail || tail > MAX_ADDRESS || !tail.is_multiple_of(8) {
            return Err(Error::Corrupted {
                page: tail,
                reason: format!("a hash log extent {begin}..{tail} is impossible"),
            });
        }
        let page = s.page_start(tail);
        let offset = tail - page;
        if offset > 0 && tail > FIRST_ADDRESS {
            let mut bytes = AlignedBuf::new(s.page_bytes as usize);
            s.device.read(page, bytes.as_mut()).map_err(Error::Io)?;
            s.check_records(page, bytes.as_ref(), tail)?;
            let frame = s.frames.ptrs[((page >> options.page_bits) % options.frames) as usize];
            // SAFETY: the frame is `page_bytes` long and no other thread has the log yet.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_mut().as_ptr(),
                    frame.as_ptr(),
                    offset as usize,
                )
            };
        }
        s.tail.store(
            (page >> options.page_bits) << 32 | offset,
            Ordering::Release,
        );
        for a in [
            &s.head,
            &s.safe_head,
            &s.closed_until,
            &s.flushed_until,
            &s.left_until,
        ] {
            a.store(page, Ordering::Release);
        }
        s.read_only.store(tail, Ordering::Release);
        s.safe_read_only.store(tail, Ordering::Release);
        s.begin.store(begin, Ordering::Release);
        Ok(log)
    }

    /// The epoch every operation on the log is protected by.
    pub(crate) fn epoch(&self) -> &Arc<Epoch> {
        &self.epoch
    }

    /// Bytes of one page: the largest record.
    pub(crate) fn page_bytes(&self) -> u64 {
        self.shared.page_bytes
    }

    /// Bytes of memory the page frames take (with their read bits, if tracked).
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.shared.page_bytes * self.shared.options.frames + 8 * self.shared.read_bits.len() as u64
    }

    /// The addresses now.
    pub(crate) fn addresses(&self) -> Addresses {
        let s = &self.shared;
        let begin = s.begin.load(Ordering::Acquire);
        let head = s.head.load(Ordering::Acquire);
        let safe_read_only = s.safe_read_only.load(Ordering::Acquire);
        let read_only = s.read_only.load(Ordering::Acquire);
        let flushed_until = s.flushed_until.load(Ordering::Acquire);
        let tail = s.tail_address();
        Addresses {
            begin,
            head,
            safe_read_only,
            read_only,
            tail,
            flushed_until,
        }
    }

    /// Reserves `size_bytes` (a multiple of 8, at most a page) at the tail. The caller
    /// fills the space ([`HybridLog::record`], then `MemRecord::init`) before it
    /// refreshes its epoch.
    ///
    /// [`Alloc::PageFull`] means the tail's page is full and the next one is not open
    /// yet: the caller drops whatever it holds from under its guard, then calls
    /// [`HybridLog::new_page`] (refreshing between calls) until it answers `true`, and
    /// starts its operation again (FASTER's `Allocate` / `NewPage` loop). An error if the
    /// device failed.
    pub(crate) fn allocate(&self, size_bytes: u64) -> Result<Alloc> {
        let s = &self.shared;
        assert!(
            size_bytes > 0 && size_bytes.is_multiple_of(8) && size_bytes <= s.page_bytes,
            "allocation of {size_bytes} bytes"
        );
        s.check_failed()?;
        let old = s.tail.fetch_add(size_bytes, Ordering::AcqRel);
        let (page, offset) = (old >> 32, old & 0xffff_ffff);
        if offset + size_bytes <= s.page_bytes {
            Ok(Alloc::At(page << s.options.page_bits | offset))
        } else {
            Ok(Alloc::PageFull(page))
        }
    }

    /// Tries to move the tail from the full page `full` to the next page: moves
    /// READ_ONLY, and HEAD if the next page's frame still holds an older page. Answers
    /// `true` once the tail has left `full` (this thread or another moved it), `false`
    /// if the frame is not free yet (refresh and call again: the flush and close wait
    /// for every thread's refresh). Any thread whose allocation found `full` full may
    /// call it; exactly one moves the tail. The caller holds nothing from under its
    /// guard, which this refreshes.
    pub(crate) fn new_page(&self, guard: &mut EpochGuard<'_, '_>, full: u64) -> Result<bool> {
        self.new_page_leaving(guard, full, &|_, _, _| {})
    }

    /// [`HybridLog::new_page`], handing `leaving` each range of pages `[from, until)`
    /// that HEAD is about to pass, once per page: the pages are flushed (no record of
    /// them changes any more) and still in their frames, which are not closed before
    /// the caller's guard refreshes (another thread may move HEAD past them meanwhile).
    pub(crate) fn new_page_leaving(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        full: u64,
        leaving: &dyn Fn(&EpochGuard<'_, '_>, u64, u64),
    ) -> Result<bool> {
        let s = &self.shared;
        let bits = s.options.page_bits;
        let next = full + 1;
        if s.tail.load(Ordering::Acquire) >> 32 != full {
            return Ok(true);
        }
        s.check_failed()?;
        if (next << bits) + s.page_bytes > MAX_ADDRESS {
            s.fail("the log's 48-bit address space is exhausted".into());
            return s.check_failed().map(|()| false);
        }
        self.shift_read_only(guard, next.saturating_sub(s.options.mutable_pages) << bits);
        // Frame `next % frames` holds page `next - frames` until it is closed.
        let need_head = (next + 1).saturating_sub(s.options.frames) << bits;
        if s.closed_until.load(Ordering::Acquire) < need_head {
            let target = need_head
                .min(s.flushed_until.load(Ordering::Acquire))
                .min(s.page_start(s.tail_address()));
            let from = s.left_until.fetch_max(target, Ordering::AcqRel);
            if from < target {
                // At or above HEAD as this thread sees it after its protection: no frame
                // of `[from, target)` is closed before this thread refreshes.
                leaving(guard, from.max(s.head.load(Ordering::Acquire)), target);
            }
            self.shift_head(guard, target);
            return Ok(false);
        }
        let mut current = s.tail.load(Ordering::Acquire);
        while current >> 32 == full {
            match s
                .tail
                .compare_exchange(current, next << 32, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => current = now,
            }
        }
        Ok(true)
    }

    /// Allocates `size_bytes` at the tail, opening pages as needed: for a caller that
    /// holds nothing from under `guard` while it waits (this refreshes it).
    pub(crate) fn allocate_waiting(
        &self,
        guard: &mut EpochGuard<'_, '_>,
        size_bytes: u64,
    ) -> Result<u64> {
        let mut spins = 0;
        loop {
            match self.allocate(size_bytes)? {
                Alloc::At(address) => return Ok(address),
                Alloc::PageFull(full) => {
                    while !self.new_page(guard, full)? {
                        guard.refresh();
                        spins += 1;
                        backoff_wait(spins);
                    }
                }
            }
        }
    }

    /// Moves READ_ONLY up to `address` (never down); once every thread has seen it,
    /// SAFE_READ_ONLY follows and the pages below are flushed.
    pub(crate) fn shift_read_only(&self, guard: &mut EpochGuard<'_, '_>, address: u64) {
        let address = address.min(self.shared.tail_address());
        if self.shared.read_only.fetch_max(address, Ordering::AcqRel) < address {
            let shared = Arc::clone(&self.shared);
            guard.bump_with_action(move || shared.on_read_only_safe(address));
        }
    }

    /// Moves HEAD up to `address` (never down, never past what is flushed); once no
    /// thread can still read them, the frames below are zeroed for reuse.
    fn shift_head(&self, guard: &mut EpochGuard<'_, '_>, address: u64) {
        let s = &self.shared;
        let address = address
            .min(s.flushed_until.load(Ordering::Acquire))
            .min(s.page_start(s.tail_address()));
        if s.head.fetch_max(address, Ordering::AcqRel) < address {
            let shared = Arc::clone(s);
            guard.bump_with_action(move || shared.on_head_safe(address));
        }
    }

    /// Makes every record below the tail read-only and flushed, and waits until they
    /// are on the device (not synced: [`HybridLog::sync`] does that). Returns the
    /// address everything below is flushed to. For checkpoints and tests.
    pub(crate) fn flush_all(&self, guard: &mut EpochGuard<'_, '_>) -> Result<u64> {
        let s = &self.shared;
        let tail = s.tail_address();
        self.shift_read_only(guard, tail);
        let mut spins = 0;
        while s.safe_read_only.load(Ordering::Acquire) < tail {
            s.check_failed()?;
            guard.refresh();
            spins += 1;
            backoff_wait(spins);
        }
        // Every record below `tail` is complete now (their writers have refreshed since).
        // The full pages below it are flushed by the action; the tail's page is written
        // as far as it is filled, but `flushed_until` stays at its start: appends go on
        // there, and the page is written whole again when the tail leaves it.
        s.flush_until(s.page_start(tail));
        if !tail.is_multiple_of(s.page_bytes) {
            s.write_page(s.page_start(tail), tail);
        }
        s.check_failed()?;
        Ok(tail)
    }

    /// Makes everything flushed so far durable on the device.
    pub(crate) fn sync(&self) -> Result<()> {
        self.shared.device.sync().map_err(|e| {
            self.shared.fail(format!("sync: {e}"));
            Error::Io(e)
        })
    }

    /// Moves BEGIN up to `address`: records below it are gone. The device gives up
    /// their space once no thread can still be reading them.
    pub(crate) fn truncate_before(&self, guard: &mut EpochGuard<'_, '_>, address: u64) {
        let s = &self.shared;
        if s.begin.fetch_max(address, Ordering::AcqRel) < address {
            let shared = Arc::clone(s);
            guard.bump_with_action(move || {
                if let Err(e) = shared.device.truncate_before(address) {
                    log::warn!("bfdb: truncating a hash log below {address}: {e}");
                }
            });
        }
    }

    /// Adds to `held` the references of the values out of line that valid records of
    /// `key` hold on its chain from `address` down to `floor` (chains only go down):
    /// the walk of compaction's "last holder reports" rule, the same for the hot and
    /// the cold log.
    pub(crate) fn references_on_chain(
        &self,
        guard: &EpochGuard<'_, '_>,
        key: &[u8],
        mut address: u64,
        floor: u64,
        held: &mut std::collections::HashSet<Vec<u8>>,
    ) -> Result<()> {
        while address != super::bucket::INVALID_ADDRESS && address >= floor {
            let Some(fetched) = self.fetch(guard, address)? else {
                break;
            };
            let (header, value) = match fetched {
                Fetched::Memory(record) => {
                    let header = record.header();
                    let value =
                        (!header.is_invalid() && record.is_out_of_line() && record.key_equals(key))
                            .then(|| record.read_log_value().1)
                            .flatten();
                    (header, value)
                }
                Fetched::Disk(record) => {
                    let value = (!record.header.is_invalid() && record.key == key)
                        .then(|| record.log_value())
                        .flatten();
                    (record.header, value)
                }
            };
            if let Some(v) = value.filter(|v| v.out_of_line) {
                held.insert(v.bytes);
            }
            address = header.previous();
        }
        Ok(())
    }

    /// The record at `address`, which must be the address of a record this log
    /// allocated and its writer published: in memory if at or above HEAD, otherwise read
    /// from the device; `None` if it is below BEGIN (truncated: a chain walk ends there).
    /// Under a guard of a batch ([`EpochHandle::protect_batched`]) a device read is
    /// taken from the batch or left to it: the pending signal of [`super::pending`].
    ///
    /// [`EpochHandle::protect_batched`]: super::epoch::EpochHandle::protect_batched
    pub(crate) fn fetch(
        &self,
        guard: &EpochGuard<'_, '_>,
        address: u64,
    ) -> Result<Option<Fetched>> {
        let s = &self.shared;
        if address < s.begin.load(Ordering::Acquire) {
            return Ok(None);
        }
        if address >= s.head.load(Ordering::Acquire) {
            // SAFETY: at or above HEAD as this protected thread saw it: the frame is
            // closed only by an action that waits for this thread to refresh, and the
            // caller vouches that a published record starts here.
            return Ok(Some(Fetched::Memory(unsafe { self.record(address) })));
        }
        // A truncation that moves BEGIN past `address` after the check above gives up
        // the device's space only once this thread has refreshed.
        match guard.read_batch() {
            Some(batch) => batch.record(self, address),
            None => self.read_from_device(address),
        }
        .map(|r| Some(Fetched::Disk(r)))
    }

    /// The records of `[from, until)`, a range within one page (`from` at a record's
    /// start, at or above BEGIN), in address order, with their addresses: the page read
    /// from its frame (word by word) or the device into one buffer, its records decoded
    /// one at a time up to its zero end. Invalid records are included (their headers say
    /// so). For compaction and recovery.
    pub(crate) fn records_in(
        &self,
        guard: &EpochGuard<'_, '_>,
        from: u64,
        until: u64,
    ) -> Result<PageRecords> {
        let s = &self.shared;
        let page = s.page_start(from);
        debug_assert!(
            until <= page + s.page_bytes,
            "{from}..{until} crosses a page"
        );
        let (bytes, from_device) = self.page_bytes_at(guard, page)?;
        let mut at = from.saturating_sub(page) as usize;
        if page == 0 {
            at = at.max(FIRST_ADDRESS as usize);
        }
        Ok(PageRecords {
            page,
            bytes,
            at,
            until: until.min(page + s.page_bytes),
            from_device,
            shared: Arc::clone(s),
        })
    }

    /// The bytes of the page at `page` (page-aligned, at or above BEGIN's page), and
    /// whether they were read from the device (rather than copied from its frame).
    fn page_bytes_at(&self, _guard: &EpochGuard<'_, '_>, page: u64) -> Result<(AlignedBuf, bool)> {
        let s = &self.shared;
        let mut page_copy = AlignedBuf::new(s.page_bytes as usize);
        if page >= s.head.load(Ordering::Acquire) {
            let frame = s.frames.ptrs[((page >> s.options.page_bits) % s.options.frames) as usize];
            for (i, out) in page_copy.as_mut().chunks_exact_mut(8).enumerate() {
                // SAFETY: at or above HEAD as this protected thread saw it (the frame is
                // not closed before it refreshes); frame words are accessed atomically.
                let word = unsafe { AtomicU64Std::from_ptr(frame.as_ptr().cast::<u64>().add(i)) };
                out.copy_from_slice(&word.load(Ordering::Acquire).to_le_bytes());
            }
            return Ok((page_copy, false));
        }
        s.device.read(page, page_copy.as_mut()).map_err(Error::Io)?;
        Ok((page_copy, true))
    }

    /// Reads the record at `address` from the device: from the device's read alignment
    /// below it, enough for a record of [`FIRST_READ_BYTES`] (one read for most
    /// records), more if its header asks for more.
    pub(crate) fn read_from_device(&self, address: u64) -> Result<DiskRecord> {
        let s = &self.shared;
        let (mut start, mut len) = self.device_span(address, FIRST_READ_BYTES);
        loop {
            // Aligned for O_DIRECT.
            let mut page = AlignedBuf::new(len);
            s.device.read(start, page.as_mut()).map_err(Error::Io)?;
            s.record_reads.fetch_add(1, Ordering::Relaxed);
            match self.decode_read(address, start, page.as_mut())? {
                Ok(record) => return Ok(record),
                Err(need) => (start, len) = self.device_span(address, need),
            }
        }
    }

    /// The device range `(start, len)` that holds `bytes` bytes from `address` (cut at
    /// the end of its page), aligned as the device reads.
    pub(crate) fn device_span(&self, address: u64, bytes: u64) -> (u64, usize) {
        let s = &self.shared;
        let align = s.device.read_align();
        let start = address - address % align;
        let page_end = s.page_start(address) + s.page_bytes;
        let len = ((address - start + bytes).div_ceil(align) * align).min(page_end - start);
        (start, len as usize)
    }

    /// The record at `address` decoded from `buf`, read from the device at `start`, or
    /// (`Err` inside) how many bytes from `address` it takes when `buf` holds too few.
    pub(crate) fn decode_read(
        &self,
        address: u64,
        start: u64,
        buf: &[u8],
    ) -> Result<std::result::Result<DiskRecord, u64>> {
        let s = &self.shared;
        let page_end = s.page_start(address) + s.page_bytes;
        let at = (address - start) as usize;
        match DiskRecord::decode(&buf[at..], (page_end - address) as usize) {
            Ok(record) => Ok(Ok(record)),
            // More than `buf` holds, within the page (`decode` checks that).
            Err(Decode::NeedBytes(n)) if n > buf.len() - at => Ok(Err(n as u64)),
            Err(Decode::NeedBytes(_)) => Err(s.corrupt(address, "cut short")),
            Err(Decode::Corrupt(why)) => Err(s.corrupt(address, &why)),
        }
    }

    /// The device, for a batch's reads.
    pub(crate) fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.shared.device
    }

    /// Names this log among the logs of a batch's reads.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// Records read from the device one at a time (chain walks, liveness checks, a
    /// batch's reads), counting a record read twice (more bytes needed) twice.
    pub(crate) fn record_reads(&self) -> u64 {
        self.shared.record_reads.load(Ordering::Relaxed)
    }

    /// Counts `n` records read from the device by a batch.
    pub(crate) fn count_record_reads(&self, n: u64) {
        self.shared.record_reads.fetch_add(n, Ordering::Relaxed);
    }

    /// A view of the record space at `address`.
    ///
    /// # Safety
    ///
    /// `address` is at or above HEAD as seen by a thread protected since before it
    /// loaded HEAD, that thread uses the view only until it refreshes, and the address
    /// was allocated by [`HybridLog::allocate`] (and is being filled by the caller, or
    /// was published).
    pub(crate) unsafe fn record(&self, address: u64) -> MemRecord {
        let s = &self.shared;
        let page = address >> s.options.page_bits;
        let frame = s.frames.ptrs[(page % s.options.frames) as usize];
        let offset = (address & (s.page_bytes - 1)) as usize;
        // SAFETY: the offset is inside the frame (a page); the caller vouches for the
        // rest of `MemRecord::at`'s contract.
        unsafe { MemRecord::at(frame.as_ptr().add(offset)) }
    }

    /// The error the log failed with, if it did.
    pub(crate) fn check_failed(&self) -> Result<()> {
        self.shared.check_failed()
    }
}

impl Shared {
    /// The read bits of the frame of the page at `page` (whole words: a frame is a
    /// multiple of 4 KiB); none if the log does not track reads.
    fn read_bits_of(&self, page: u64) -> &[AtomicU64Std] {
        if self.read_bits.is_empty() {
            return &[];
        }
        let words = self.page_bytes / 8 / 64;
        let first = ((page >> self.options.page_bits) % self.options.frames) * words;
        &self.read_bits[first as usize..(first + words) as usize]
    }

    fn tail_address(&self) -> u64 {
        let t = self.tail.load(Ordering::Acquire);
        let (page, offset) = (t >> 32, (t & 0xffff_ffff).min(self.page_bytes));
        // A sum, not `|`: the offset of a full page is `page_bytes`, whose bit is the
        // page number's lowest, so an or would put an odd full page's tail at its start
        // (and a checkpoint would leave its records out of the log's extent).
        (page << self.options.page_bits) + offset
    }

    fn page_start(&self, address: u64) -> u64 {
        address & !(self.page_bytes - 1)
    }

    /// The error for damaged bytes of the record at `address` read from the device:
    /// naming the device's file that holds it, where it has files.
    fn corrupt(&self, address: u64, why: &str) -> Error {
        self.device.damaged(
            address,
            format!("hash log record at address {address}: {why}"),
        )
    }

    /// Checks the checksum of every record of `bytes`, the page at `page` read from the
    /// device, below `until`.
    fn check_records(&self, page: u64, bytes: &[u8], until: u64) -> Result<()> {
        let mut at = if page == 0 { FIRST_ADDRESS as usize } else { 0 };
        while page + (at as u64) < until {
            let address = page + at as u64;
            let record = match DiskRecord::decode(&bytes[at..], bytes.len() - at) {
                Ok(record) => record,
                Err(Decode::Corrupt(why)) => return Err(self.corrupt(address, &why)),
                Err(Decode::NeedBytes(_)) => return Err(self.corrupt(address, "cut short")),
            };
            at += super::record::record_size_bytes(record.key.len(), record.value.len());
        }
        Ok(())
    }

    fn fail(&self, why: String) {
        let mut failure = self.failure.lock();
        failure.get_or_insert(why);
        self.failed.store(true, Ordering::Release);
    }

    fn check_failed(&self) -> Result<()> {
        if self.failed.load(Ordering::Acquire) {
            let cause = self.failure.lock().clone().unwrap_or_default();
            return Err(Error::Poisoned { cause });
        }
        Ok(())
    }

    /// Trigger action of a READ_ONLY move: every thread has seen READ_ONLY at
    /// `address`, so no in-place update runs below it.
    fn on_read_only_safe(&self, address: u64) {
        self.safe_read_only.fetch_max(address, Ordering::AcqRel);
        self.flush_until(self.page_start(address));
    }

    /// Writes the pages from `flushed_until` up to `until` (page-aligned, at most one
    /// page past SAFE_READ_ONLY's page) to the device, in order.
    fn flush_until(&self, until: u64) {
        let _order = self.flushing.lock();
        let mut at = self.flushed_until.load(Ordering::Acquire);
        while at < until && !self.failed.load(Ordering::Acquire) {
            // Page `at` is below SAFE_READ_ONLY (the callers), so nobody writes it in
            // place any more, and its frame is not closed before `flushed_until` passes.
            if !self.write_page(at, at + self.page_bytes) {
                return;
            }
            at += self.page_bytes;
            self.flushed_until.store(at, Ordering::Release);
        }
    }

    /// Writes the page at `at` from its frame to the device, with the checksums of its
    /// records below `until` (the page's end, or a checkpoint's tail on its page: bytes
    /// past it are written as zeros); false (and the log failed) on an error. The caller
    /// makes sure the frame holds that page, and that its records below `until` are
    /// complete and no longer change in place.
    fn write_page(&self, at: u64, until: u64) -> bool {
        let page = at >> self.options.page_bits;
        let frame = self.frames.ptrs[(page % self.options.frames) as usize];
        // The page is copied word by word with atomic loads: `flush_all` writes the
        // tail's page while appends past the tail may still fill it, and the header
        // words of records are atomics everywhere. (A flush of a page below
        // SAFE_READ_ONLY races with nothing; the copy costs little beside the write.)
        let mut copy = AlignedBuf::new(self.page_bytes as usize);
        for (i, out) in copy.as_mut().chunks_exact_mut(8).enumerate() {
            // SAFETY: word `i` of a live, 8-aligned frame of `page_bytes`; frame words
            // are only ever accessed atomically while threads run.
            let word = unsafe { AtomicU64Std::from_ptr(frame.as_ptr().cast::<u64>().add(i)) };
            out.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        let first = if at == 0 { FIRST_ADDRESS as usize } else { 0 };
        stamp_checksums(copy.as_mut(), first, (until - at) as usize);
        match self.device.write(at, copy.as_mut()) {
            Ok(()) => true,
            Err(e) => {
                self.fail(format!("writing hash log page at {at}: {e}"));
                false
            }
        }
    }

    /// Trigger action of a HEAD move: no thread reads the frames below `address`.
    fn on_head_safe(&self, address: u64) {
        let _order = self.closing.lock();
        let mut at = self.closed_until.load(Ordering::Acquire);
        while at < address {
            let page = at >> self.options.page_bits;
            let frame = self.frames.ptrs[(page % self.options.frames) as usize];
            // SAFETY: the page is below HEAD, which every thread has seen (this is the
            // trigger action of its move), and flushed; no thread touches the frame
            // until `closed_until` passes it, which is set below.
            unsafe { std::ptr::write_bytes(frame.as_ptr(), 0, self.page_bytes as usize) };
            for word in self.read_bits_of(at) {
                word.store(0, std::sync::atomic::Ordering::Relaxed);
            }
            at += self.page_bytes;
        }
        self.safe_head.fetch_max(address, Ordering::AcqRel);
        self.closed_until.fetch_max(address, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for HybridLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridLog")
            .field("options", &self.shared.options)
            .field("addresses", &self.addresses())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;
    use crate::hash::record::{Header, record_size_bytes};
    use crate::storage::{MemBlocks, SegmentFiles};

    fn key(i: u64) -> Vec<u8> {
        format!("key-{i:06}").into_bytes()
    }

    fn value(i: u64, len: usize) -> Vec<u8> {
        (0..len).map(|j| (i as usize + j) as u8).collect()
    }

    /// Appends record `i` (previous address `prev`) and returns its address.
    fn append(log: &HybridLog, guard: &mut EpochGuard<'_, '_>, i: u64, len: usize) -> u64 {
        let (k, v) = (key(i), value(i, len));
        let size = record_size_bytes(k.len(), v.len()) as u64;
        let address = log.allocate_waiting(guard, size).unwrap();
        // SAFETY: just allocated, at the tail (above HEAD); used before any refresh.
        let rec = unsafe { log.record(address) };
        rec.init(Header::new(i, false), &k, &v);
        address
    }

    fn check(log: &HybridLog, guard: &EpochGuard<'_, '_>, address: u64, i: u64, len: usize) {
        let (k, v, prev) = match log.fetch(guard, address).unwrap().unwrap() {
            Fetched::Memory(r) => {
                let (h, v) = r.read_value();
                (r.key(), v, h.previous())
            }
            Fetched::Disk(d) => (d.key, d.value, d.header.previous()),
        };
        assert_eq!(
            (k, v, prev),
            (key(i), value(i, len), i),
            "record {i} at {address}"
        );
    }

    #[test]
    fn options_from_a_memory_size_keep_a_read_only_region() {
        let o = HlogOptions::with_memory(40 << 20, 20);
        assert_eq!((o.frames, o.mutable_pages), (40, 36));
        let o = HlogOptions::with_memory(1 << 10, 12);
        assert_eq!((o.frames, o.mutable_pages), (2, 1));
        assert!(o.validate().is_ok());
        let bad = HlogOptions {
            mutable_pages: 2,
            ..o
        };
        assert!(bad.validate().is_err());
    }

    fn small(device: Arc<dyn BlockDevice>) -> HybridLog {
        let options = HlogOptions {
            page_bits: 12,
            frames: 4,
            mutable_pages: 2,
        };
        HybridLog::new(options, device, Arc::new(Epoch::new())).unwrap()
    }

    #[test]
    fn records_beyond_memory_are_flushed_closed_and_read_back_from_the_device() {
        let device = Arc::new(MemBlocks::new());
        let log = small(device.clone());
        let epoch = Arc::clone(log.epoch());
        let mut handle = epoch.register();
        let mut guard = handle.protect();
        let mut addresses = Vec::new();
        // About 60 pages of records of varied sizes, through four frames.
        for i in 0..1_500u64 {
            let len = (i % 300) as usize;
            addresses.push(append(&log, &mut guard, i, len));
            if i % 7 == 0 {
                guard.refresh();
            }
            let a = log.addresses();
            assert!(
                a.begin <= a.head.max(a.begin)
                    && a.head <= a.safe_read_only
                    && a.safe_read_only <= a.read_only
                    && a.read_only <= a.tail
                    && a.head <= a.flushed_until,
                "{a:?}"
            );
        }
        let a = log.addresses();
        assert!(a.head > 40 * 4096, "HEAD stayed at {}", a.head);
        assert!(
            a.tail - a.head <= 4 * 4096,
            "more than the frames in memory: {a:?}"
        );
        // No two records overlap, and none crosses a page.
        for w in addresses.windows(2) {
            assert!(w[0] < w[1]);
        }
        for (i, &address) in addresses.iter().enumerate() {
            let len = i % 300;
            let size = record_size_bytes(key(i as u64).len(), len) as u64;
            assert_eq!(
                address / 4096,
                (address + size - 1) / 4096,
                "record {i} crosses a page"
            );
            check(&log, &guard, address, i as u64, len);
        }
        let (written, read) = device.io_bytes();
        assert!(
            written >= 40 * 4096 && read > 0,
            "written {written}, read {read}"
        );
    }

    #[test]
    fn threads_appending_at_once_get_disjoint_space_and_every_record_reads_back() {
        let log = small(Arc::new(MemBlocks::new()));
        let per_thread = 2_000u64;
        let all: Vec<Vec<(u64, u64)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4u64)
                .map(|t| {
                    let log = &log;
                    s.spawn(move || {
                        let mut handle = log.epoch().register();
                        let mut guard = handle.protect();
                        let mut mine = Vec::new();
                        for n in 0..per_thread {
                            let i = t * per_thread + n;
                            mine.push((i, append(log, &mut guard, i, (i % 200) as usize)));
                            guard.refresh();
                        }
                        mine
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut spans: Vec<(u64, u64)> = all
            .iter()
            .flatten()
            .map(|&(i, a)| {
                (
                    a,
                    a + record_size_bytes(key(i).len(), (i % 200) as usize) as u64,
                )
            })
            .collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            assert!(w[0].1 <= w[1].0, "overlapping records {w:?}");
        }
        let mut handle = log.epoch().register();
        let guard = handle.protect();
        for &(i, address) in all.iter().flatten() {
            check(&log, &guard, address, i, (i % 200) as usize);
        }
    }

    #[test]
    fn a_full_odd_page_ends_the_tail_and_flush_all_at_its_end() {
        let device = Arc::new(MemBlocks::new());
        let log = small(device.clone());
        let mut handle = log.epoch().register();
        let mut guard = handle.protect();
        // Records of half a page: page 0 (which starts at 64) takes one, page 1 two,
        // which fill it to the byte.
        let len = (0..4096)
            .find(|&len| record_size_bytes(key(0).len(), len) == 2048)
            .expect("a value length that makes a record of half a page");
        let addresses: Vec<u64> = (1..=3).map(|i| append(&log, &mut guard, i, len)).collect();
        assert_eq!(addresses[1..], [4096, 4096 + 2048]);
        assert_eq!(log.addresses().tail, 2 * 4096, "the tail of a full page 1");
        assert_eq!(log.flush_all(&mut guard).unwrap(), 2 * 4096);
        let mut page = vec![0u8; 4096];
        device.read(4096, &mut page).unwrap();
        let last = DiskRecord::decode(&page[2048..], 2048).unwrap();
        assert_eq!((last.key, last.value), (key(3), value(3, len)));
    }

    #[test]
    fn in_place_updates_and_flush_all_reach_the_device() {
        let dir = tempfile::tempdir().unwrap();
        let device = Arc::new(SegmentFiles::new(
            dir.path(),
            ("hot", "hlog"),
            8 * 4096,
            false,
        ));
        let log = small(device.clone());
        let mut handle = log.epoch().register();
        let mut guard = handle.protect();
        let first = append(&log, &mut guard, 1, 64);
        // SAFETY: `first` is in the tail's page, in memory; used before a refresh.
        assert!(unsafe { log.record(first) }.update_in_place(&value(2, 64)));
        let flushed = log.flush_all(&mut guard).unwrap();
        log.sync().unwrap();
        assert!(flushed > first);
        let mut buf = vec![0u8; 4096];
        device.read(0, &mut buf).unwrap();
        let on_disk = DiskRecord::decode(&buf[first as usize..], 4096 - first as usize).unwrap();
        assert_eq!(on_disk.value, value(2, 64));
        // Appends after a flush_all go on in the same page, and reach the device when it
        // is flushed again.
        let second = append(&log, &mut guard, 3, 10);
        assert_eq!(second / 4096, first / 4096);
        for i in 10..400 {
            append(&log, &mut guard, i, 100);
            guard.refresh();
        }
        check(&log, &guard, second, 3, 10);
        assert!(log.addresses().head > second, "the page left memory");
        // Truncation: the device's segments below BEGIN go, and reads below it fail.
        let a = log.addresses();
        log.truncate_before(&mut guard, a.head);
        guard.refresh();
        drop(guard);
        let guard = handle.protect();
        assert!(log.fetch(&guard, first).unwrap().is_none());
        let segments = std::fs::read_dir(dir.path()).unwrap().count() as u64;
        assert!(
            segments <= a.tail / (8 * 4096) + 1 - a.head / (8 * 4096) + 1,
            "{segments}"
        );
        assert!(!dir.path().join("hot-00000000.hlog").exists());
    }

    #[test]
    fn a_failed_device_fails_allocations_instead_of_waiting_forever() {
        let device = Arc::new(MemBlocks::new());
        let log = small(device.clone());
        let mut handle = log.epoch().register();
        let mut guard = handle.protect();
        device.fail_writes();
        let mut failed = None;
        for i in 0..2_000 {
            let size = record_size_bytes(8, 100) as u64;
            match log.allocate_waiting(&mut guard, size) {
                Ok(address) => {
                    // SAFETY: just allocated; used before a refresh.
                    unsafe { log.record(address) }.init(Header::new(0, false), &key(i), &[0; 100]);
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        assert!(
            matches!(failed, Some(Error::Poisoned { .. })),
            "allocations went on past a failed flush: {failed:?}"
        );
        assert!(log.check_failed().is_err());
    }
}
