//! A page store in one file, read and written with `pread`/`pwrite`, optionally with
//! `O_DIRECT`.
//!
//! # File format
//!
//! The file is an array of 4 KiB slots; slot `n` starts at byte `n * PAGE_SIZE`.
//!
//! ```text
//! slot 0, 1    superblock copies, written alternately (generation g lives in slot g % 2)
//! slot 2..     data pages, free slots, and the pages of the free-list chain
//! ```
//!
//! Superblock payload (after the 16-byte page header of kind 2), little-endian:
//!
//! ```text
//! 0..8    magic b"BFDBFILE"
//! 8..10   format version (u16)
//! 10..12  reserved, zero
//! 12..16  page size in bytes (u32)
//! 16..24  generation (u64); slot = generation % 2
//! 24..32  high-water mark: number of slots the durable state covers (u64)
//! 32..40  first page of the free-list chain, 0 if none (u64)
//! 40..48  number of free page numbers the chain lists (u64)
//! 48..56  number of pages in the chain (u64)
//! ```
//!
//! Free-list page payload (after the page header of kind 3):
//!
//! ```text
//! 0..8    next page of the chain, 0 at the end (u64)
//! 8..12   number of entries in this page (u32, at most FREE_LIST_ENTRIES_PER_PAGE)
//! 12..16  reserved, zero
//! 16..    entries: free page numbers (u64 each)
//! ```
//!
//! # Allocation and the crash argument
//!
//! Free slots live in memory and reach the file only at [`PageStore::sync`], which
//! writes a *new* free-list chain, `fdatasync`s, then writes the superblock copy the
//! newest durable superblock does not occupy, and `fdatasync`s again. The superblock
//! write is the commit point: a crash before it leaves the previous superblock and the
//! chain it points to intact, a crash after it leaves the new ones; a torn superblock
//! fails its checksum and the other copy wins.
//!
//! Three rules keep the durable chain from ever being overwritten:
//!
//! 1. The pages of the durable chain are *withheld*: not allocatable, not readable, not
//!    writable. They become free only when the next superblock, which no longer points at
//!    them, is durable.
//! 2. A new chain is written only into slots that the durable state already considers
//!    free, or into slots past the durable high-water mark. Slots freed since the last
//!    sync are never used for it, because the durable state still calls them allocated
//!    and a crash before the commit must find them as they were.
//! 3. `allocate` extends the file (`ftruncate`) before handing out a slot past its end,
//!    so the file always covers the high-water mark and a sync makes that length durable
//!    with the data; opening can then tell a truncated file from a crashed one.
//!
//! On open, slots between the durable high-water mark and the end of the file were
//! allocated after the last sync; they become free slots.
//!
//! Falling back to the older superblock copy is exact when the newer copy is a torn
//! last write. If a committed superblock later rots on the medium, the fallback state
//! is one sync old: its free-list chain is still checked (chain pages carry their
//! generation in the lsn), but client pages freed and reused since then may hold newer
//! bytes than that state expects.

use std::collections::BTreeSet;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::uring::Direction;
use super::{
    CorruptPage, FORMAT_VERSION, IncompatibleFile, PAGE_HEADER_SIZE, PAGE_PAYLOAD_SIZE, PAGE_SIZE,
    Page, PageKind, PageNo, PageStore, Poison, StorePoisoned, StoreStats, corrupt_page,
    incompatible_file, not_allocated,
};
use crate::sync::atomic::{AtomicU8, Ordering};
use crate::sync::{Mutex, RwLock};

/// The magic bytes that open every superblock payload.
const MAGIC: [u8; 8] = *b"BFDBFILE";

/// Slots 0 and 1 hold the two superblock copies; data slots start here.
const FIRST_DATA_SLOT: u64 = 2;

/// `PAGE_SIZE` as a `u64`, for offset arithmetic.
const PAGE_SIZE_U64: u64 = PAGE_SIZE as u64;

// Superblock payload offsets.
const SB_MAGIC: std::ops::Range<usize> = 0..8;
const SB_VERSION: std::ops::Range<usize> = 8..10;
const SB_RESERVED: std::ops::Range<usize> = 10..12;
const SB_PAGE_SIZE: std::ops::Range<usize> = 12..16;
const SB_GENERATION: std::ops::Range<usize> = 16..24;
const SB_HIGH_WATER: std::ops::Range<usize> = 24..32;
const SB_FREE_HEAD: std::ops::Range<usize> = 32..40;
const SB_FREE_COUNT: std::ops::Range<usize> = 40..48;
const SB_FREE_LIST_PAGES: std::ops::Range<usize> = 48..56;
const SUPERBLOCK_SIZE_BYTES: usize = 56;

const _: () = assert!(SB_MAGIC.end == SB_VERSION.start);
const _: () = assert!(SB_VERSION.end == SB_RESERVED.start);
const _: () = assert!(SB_RESERVED.end == SB_PAGE_SIZE.start);
const _: () = assert!(SB_PAGE_SIZE.end == SB_GENERATION.start);
const _: () = assert!(SB_GENERATION.end == SB_HIGH_WATER.start);
const _: () = assert!(SB_HIGH_WATER.end == SB_FREE_HEAD.start);
const _: () = assert!(SB_FREE_HEAD.end == SB_FREE_COUNT.start);
const _: () = assert!(SB_FREE_COUNT.end == SB_FREE_LIST_PAGES.start);
const _: () = assert!(SB_FREE_LIST_PAGES.end == SUPERBLOCK_SIZE_BYTES);
const _: () = assert!(SUPERBLOCK_SIZE_BYTES <= PAGE_PAYLOAD_SIZE);

// Free-list page payload offsets.
const FL_NEXT: std::ops::Range<usize> = 0..8;
const FL_COUNT: std::ops::Range<usize> = 8..12;
const FL_RESERVED: std::ops::Range<usize> = 12..16;
const FL_ENTRIES_START: usize = 16;

const _: () = assert!(FL_NEXT.end == FL_COUNT.start);
const _: () = assert!(FL_COUNT.end == FL_RESERVED.start);
const _: () = assert!(FL_RESERVED.end == FL_ENTRIES_START);

/// How many free page numbers one free-list page holds.
pub const FREE_LIST_ENTRIES_PER_PAGE: usize = (PAGE_PAYLOAD_SIZE - FL_ENTRIES_START) / 8;

const _: () = assert!(FREE_LIST_ENTRIES_PER_PAGE == 508);
const _: () = assert!(PAGE_HEADER_SIZE + FL_ENTRIES_START + 8 * 508 <= PAGE_SIZE);

fn le_u64(bytes: &[u8], range: std::ops::Range<usize>) -> u64 {
    u64::from_le_bytes(bytes[range].try_into().expect("8-byte range"))
}

fn le_u32(bytes: &[u8], range: std::ops::Range<usize>) -> u32 {
    u32::from_le_bytes(bytes[range].try_into().expect("4-byte range"))
}

fn le_u16(bytes: &[u8], range: std::ops::Range<usize>) -> u16 {
    u16::from_le_bytes(bytes[range].try_into().expect("2-byte range"))
}

/// How a [`FileStore`] reads and writes its data pages.
///
/// Only data pages go through the engine; the superblocks and the free-list chain,
/// written once per sync, always use `pread`/`pwrite`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IoEngine {
    /// One `pread`/`pwrite` system call per page, on the calling thread.
    #[default]
    Pread,
    /// io_uring, on a ring owned by the calling thread: [`PageStore::read_pages`] and
    /// [`PageStore::write_pages`] submit a whole batch in one system call and keep it in
    /// flight together. See the `storage::uring` module docs.
    IoUring,
}

/// How to open a [`FileStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOptions {
    /// Create the file if it does not exist, and initialize it if it is empty.
    pub create: bool,
    /// Open with `O_DIRECT`, bypassing the OS page cache. Falls back to buffered IO if
    /// the filesystem refuses it; see [`FileStore::direct_io_active`].
    pub direct_io: bool,
    /// How data pages are read and written. Default [`IoEngine::Pread`].
    pub io_engine: IoEngine,
    /// With [`IoEngine::IoUring`]: submit through SQPOLL rings, whose kernel thread
    /// polls the submission queue so that submitting needs no system call. Off by
    /// default: every thread's ring gets its own polling kernel thread, which keeps a
    /// core busy while the thread does IO and for a short while after.
    pub sqpoll: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            create: true,
            direct_io: false,
            io_engine: IoEngine::Pread,
            sqpoll: false,
        }
    }
}

impl FileOptions {
    /// The defaults: create the file if needed, buffered IO, `pread`/`pwrite`.
    pub fn new() -> FileOptions {
        FileOptions::default()
    }

    /// Sets [`FileOptions::create`].
    pub fn create(mut self, create: bool) -> FileOptions {
        self.create = create;
        self
    }

    /// Sets [`FileOptions::direct_io`].
    pub fn direct_io(mut self, direct_io: bool) -> FileOptions {
        self.direct_io = direct_io;
        self
    }

    /// Sets [`FileOptions::io_engine`].
    pub fn io_engine(mut self, io_engine: IoEngine) -> FileOptions {
        self.io_engine = io_engine;
        self
    }

    /// Sets [`FileOptions::sqpoll`].
    pub fn sqpoll(mut self, sqpoll: bool) -> FileOptions {
        self.sqpoll = sqpoll;
        self
    }
}

/// The decoded fields of a superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Superblock {
    generation: u64,
    high_water: u64,
    free_head: u64,
    free_count: u64,
    free_list_pages: u64,
}

impl Superblock {
    /// Encodes the superblock into a fresh page and stamps its header.
    fn to_page(self) -> Box<Page> {
        let mut page = Page::boxed();
        let p = page.payload_mut();
        p[SB_MAGIC].copy_from_slice(&MAGIC);
        p[SB_VERSION].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        p[SB_PAGE_SIZE].copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
        p[SB_GENERATION].copy_from_slice(&self.generation.to_le_bytes());
        p[SB_HIGH_WATER].copy_from_slice(&self.high_water.to_le_bytes());
        p[SB_FREE_HEAD].copy_from_slice(&self.free_head.to_le_bytes());
        p[SB_FREE_COUNT].copy_from_slice(&self.free_count.to_le_bytes());
        p[SB_FREE_LIST_PAGES].copy_from_slice(&self.free_list_pages.to_le_bytes());
        // The lsn of store-internal pages carries the generation, which helps whoever
        // inspects a file by hand.
        page.set_lsn(self.generation);
        page.stamp(PageKind::Superblock);
        page
    }

    /// Checks the fields for consistency with each other; `slot` is where the copy was
    /// read. Returns the reason if they are inconsistent.
    fn validate(&self, slot: u64) -> Result<(), String> {
        let data_slots = self.high_water.checked_sub(FIRST_DATA_SLOT);
        let Some(data_slots) = data_slots else {
            return Err(format!("high-water mark {} is below 2", self.high_water));
        };
        if self.generation % 2 != slot {
            return Err(format!(
                "generation {} does not belong in slot {slot}",
                self.generation
            ));
        }
        if (self.free_head == 0) != (self.free_list_pages == 0) {
            return Err(format!(
                "free-list head {} disagrees with free-list page count {}",
                self.free_head, self.free_list_pages
            ));
        }
        if self.free_head != 0 && !(FIRST_DATA_SLOT..self.high_water).contains(&self.free_head) {
            return Err(format!(
                "free-list head {} lies outside the data slots 2..{}",
                self.free_head, self.high_water
            ));
        }
        let accounted = self.free_count.checked_add(self.free_list_pages);
        if accounted.is_none_or(|n| n > data_slots) {
            return Err(format!(
                "{} free slots and {} free-list pages exceed the {data_slots} data slots",
                self.free_count, self.free_list_pages
            ));
        }
        if self.free_count
            > self
                .free_list_pages
                .saturating_mul(FREE_LIST_ENTRIES_PER_PAGE as u64)
        {
            return Err(format!(
                "{} free slots cannot fit in {} free-list pages",
                self.free_count, self.free_list_pages
            ));
        }
        Ok(())
    }
}

/// What one superblock slot turned out to hold.
#[derive(Debug)]
enum SuperblockCopy {
    /// A checksum-valid, consistent superblock of this format version.
    Valid(Superblock),
    /// It carries the magic but fails its checksum or its consistency checks.
    Corrupt(String),
    /// It does not carry the magic: not a bfdb superblock at all.
    Foreign,
    /// A checksum-valid bfdb superblock of another version or page size.
    OtherFormat(String),
}

/// Classifies the superblock copy read from `slot`.
fn classify_superblock(page: &Page, slot: u64) -> SuperblockCopy {
    let p = page.payload();
    if p[SB_MAGIC] != MAGIC {
        return SuperblockCopy::Foreign;
    }
    if page.stored_crc() != page.computed_crc() {
        return SuperblockCopy::Corrupt(format!("superblock copy {slot}: checksum mismatch"));
    }
    let header_version = page.version();
    let version = le_u16(p, SB_VERSION);
    if header_version != FORMAT_VERSION || version != FORMAT_VERSION {
        return SuperblockCopy::OtherFormat(format!(
            "format version {version} (page header says {header_version}); this build \
             understands version {FORMAT_VERSION}"
        ));
    }
    let page_size = le_u32(p, SB_PAGE_SIZE);
    if page_size as usize != PAGE_SIZE {
        return SuperblockCopy::OtherFormat(format!(
            "page size {page_size}; this build uses {PAGE_SIZE}"
        ));
    }
    if page.kind_raw() != PageKind::Superblock as u16 {
        return SuperblockCopy::Corrupt(format!(
            "superblock copy {slot}: page kind is {}",
            page.kind_raw()
        ));
    }
    let sb = Superblock {
        generation: le_u64(p, SB_GENERATION),
        high_water: le_u64(p, SB_HIGH_WATER),
        free_head: le_u64(p, SB_FREE_HEAD),
        free_count: le_u64(p, SB_FREE_COUNT),
        free_list_pages: le_u64(p, SB_FREE_LIST_PAGES),
    };
    match sb.validate(slot) {
        Ok(()) => SuperblockCopy::Valid(sb),
        Err(reason) => SuperblockCopy::Corrupt(format!("superblock copy {slot}: {reason}")),
    }
}

/// Picks the superblock to trust from the two copies, or explains why there is none.
fn choose_superblock(copies: [SuperblockCopy; 2]) -> io::Result<Superblock> {
    // A copy of another format means another build has written this file; guessing
    // which copy it considers current would be unsafe, so refuse outright.
    for copy in &copies {
        if let SuperblockCopy::OtherFormat(reason) = copy {
            return Err(incompatible_file(reason.clone()));
        }
    }
    let newest = copies
        .iter()
        .filter_map(|c| match c {
            SuperblockCopy::Valid(sb) => Some(*sb),
            _ => None,
        })
        .max_by_key(|sb| sb.generation);
    if let Some(sb) = newest {
        return Ok(sb);
    }
    if copies.iter().all(|c| matches!(c, SuperblockCopy::Foreign)) {
        return Err(incompatible_file(
            "not a bfdb file: neither superblock slot carries the magic bytes",
        ));
    }
    let reasons: Vec<String> = copies
        .iter()
        .enumerate()
        .map(|(slot, c)| match c {
            SuperblockCopy::Corrupt(r) => r.clone(),
            _ => format!("superblock copy {slot}: no magic bytes"),
        })
        .collect();
    let first_bad = copies
        .iter()
        .position(|c| matches!(c, SuperblockCopy::Corrupt(_)))
        .unwrap_or(0) as u64;
    Err(corrupt_page(
        PageNo(first_bad),
        format!("both superblock copies are invalid: {}", reasons.join("; ")),
    ))
}

/// The allocation state, kept in memory and persisted at sync.
#[derive(Debug)]
struct AllocState {
    /// Slots `0..high_water` exist; allocation past them extends the file.
    high_water: u64,
    /// The high-water mark of the newest superblock, durable or being made durable by
    /// the running sync. Slots at or past it are unknown to the durable state.
    durable_high_water: u64,
    /// Free slots that the durable state calls allocated: freed since the last sync.
    /// Never used for a free-list chain (rule 2 of the module docs).
    free_recent: BTreeSet<u64>,
    /// Free slots that the durable state also calls free, or that lie past its
    /// high-water mark: safe to overwrite with a new free-list chain.
    free_durable: BTreeSet<u64>,
    /// Pages of the durable chain and of the chain a running sync is writing: neither
    /// free nor allocated.
    withheld: BTreeSet<u64>,
    /// The pages of the durable chain, in chain order.
    chain: Vec<u64>,
    /// The generation of the newest durable superblock.
    generation: u64,
    /// The file length in bytes as this store knows it; `allocate` keeps it at or above
    /// `high_water * PAGE_SIZE`.
    file_len_bytes: u64,
    /// The allocation state changed since the last superblock was planned.
    dirty: bool,
}

impl AllocState {
    fn is_allocated(&self, no: u64) -> bool {
        (FIRST_DATA_SLOT..self.high_water).contains(&no)
            && !self.free_recent.contains(&no)
            && !self.free_durable.contains(&no)
            && !self.withheld.contains(&no)
    }

    fn free_pages(&self) -> u64 {
        (self.free_recent.len() + self.free_durable.len()) as u64
    }
}

/// What a sync will write, decided under the state lock and written without it.
struct SyncPlan {
    /// The new chain's pages, in chain order.
    chain: Vec<u64>,
    /// Every free page number the new chain lists, sorted.
    entries: Vec<u64>,
    superblock: Superblock,
    /// The chain the new superblock replaces; freed when it is durable.
    old_chain: Vec<u64>,
}

/// Where a test wants the next sync to stop, simulating a crash of the process there.
///
/// The sync returns an error at that point, which poisons the store; the test then
/// drops it and reopens the file to check what the durable state is.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SyncCrashPoint {
    /// Run syncs to completion.
    None = 0,
    /// Stop after writing the new free-list chain, before the first fsync.
    AfterFreeList = 1,
    /// Stop after the first fsync, before writing the superblock.
    BeforeSuperblock = 2,
    /// Write only the page header of the new superblock over the old copy, then stop:
    /// a torn write.
    TornSuperblock = 3,
}

/// A [`PageStore`] over one file.
///
/// Reads and writes use positioned IO (`pread`/`pwrite`), so threads share the file
/// without seeking, and operations on different pages run concurrently. Allocation and
/// free take a short lock on the in-memory allocation state; `sync` holds that lock only
/// while it plans, never across IO.
///
/// The file is `flock`ed exclusively while the store is open, so a second store on the
/// same file (in this process or another) fails to open with
/// [`io::ErrorKind::WouldBlock`]. Filesystems without `flock` support are used unlocked.
///
/// After a failed write or sync the store is poisoned: `write_page`, `allocate`, `free`
/// and `sync` return an error carrying [`super::StorePoisoned`]; reads still work. Drop
/// the store and open the file again to continue from its durable state.
///
/// Dropping the store does not sync it.
pub struct FileStore {
    file: File,
    path: Option<PathBuf>,
    direct_io_active: bool,
    io_engine: IoEngine,
    sqpoll: bool,
    state: RwLock<AllocState>,
    /// Serializes syncs, so that one plan is committed before the next is made.
    sync_lock: Mutex<()>,
    poison: Poison,
    /// A [`SyncCrashPoint`] set by tests.
    crash_point: AtomicU8,
}

impl fmt::Debug for FileStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileStore")
            .field("path", &self.path)
            .field("direct_io_active", &self.direct_io_active)
            .field("io_engine", &self.io_engine)
            .field("poisoned", &self.poison.is_poisoned())
            .field("stats", &self.stats())
            .finish()
    }
}

thread_local! {
    /// Set by [`simulate_o_direct_refused_for_test`].
    static SIMULATE_NO_O_DIRECT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes stores opened by the calling thread behave as if the filesystem refused
/// `O_DIRECT` (for tests of the fallback to buffered IO).
#[doc(hidden)]
pub fn simulate_o_direct_refused_for_test(refused: bool) {
    SIMULATE_NO_O_DIRECT.with(|s| s.set(refused));
}

/// Opens `path` read-write, with `O_DIRECT` if asked and the filesystem accepts it.
/// Returns the file and whether `O_DIRECT` is active.
fn open_file(path: &Path, options: &FileOptions) -> io::Result<(File, bool)> {
    let mut open = OpenOptions::new();
    open.read(true).write(true).create(options.create);
    if options.direct_io && !SIMULATE_NO_O_DIRECT.with(std::cell::Cell::get) {
        let mut direct = open.clone();
        direct.custom_flags(libc::O_DIRECT);
        match direct.open(path) {
            Ok(file) => return Ok((file, true)),
            // Filesystems without O_DIRECT support (tmpfs on older kernels, some FUSE
            // mounts) refuse the flag with EINVAL; buffered IO still works there.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    Ok((open.open(path)?, false))
}

/// Whether `file` was opened with `O_DIRECT`.
fn has_o_direct(file: &File) -> io::Result<bool> {
    let fd = file.as_raw_fd();
    // SAFETY: `fd` belongs to `file`, which stays open for the whole call, and
    // F_GETFL takes no pointer argument, so the call touches no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags & libc::O_DIRECT != 0)
}

/// Fails if `options` ask for an IO engine the calling thread cannot use.
fn check_engine(options: &FileOptions) -> io::Result<()> {
    match options.io_engine {
        IoEngine::Pread => Ok(()),
        IoEngine::IoUring => super::uring::probe_ring(options.sqpoll).map_err(|e| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("io_uring is not available: {e}"),
            )
        }),
    }
}

/// Turns a read that reached the end of the file into the error for a slot that was
/// allocated but never written; other errors pass unchanged.
fn unwritten(no: PageNo, e: io::Error) -> io::Error {
    if e.kind() != io::ErrorKind::UnexpectedEof {
        return e;
    }
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "cannot read page {no}: it lies past the end of the file, so it was allocated \
             but never written"
        ),
    )
}

/// Names `path` in `e`, so that a message like "No such file or directory" says which
/// file it concerns. The kind stays, so callers can still match on it; the original error
/// stays reachable as the source. Errors without a path, errors that already name one, and
/// the storage layer's typed errors (which `bfdb::Error` lifts into their own variants)
/// pass unchanged.
pub(crate) fn name_path(path: Option<&Path>, e: io::Error) -> io::Error {
    let Some(path) = path else {
        return e;
    };
    if let Some(inner) = e.get_ref()
        && (inner.is::<PathIoError>()
            || inner.is::<CorruptPage>()
            || inner.is::<IncompatibleFile>()
            || inner.is::<StorePoisoned>())
    {
        return e;
    }
    io::Error::new(
        e.kind(),
        PathIoError {
            path: path.to_path_buf(),
            source: e,
        },
    )
}

/// The detail inside an `io::Error` from a [`FileStore`] opened by path: the OS error and
/// the file or directory it concerns.
///
/// It travels as `io::Error::new(source.kind(), PathIoError { .. })`, so the error's kind
/// is that of the OS error; its message reads `"<path>: <OS error>"`.
#[derive(Debug)]
pub struct PathIoError {
    /// The file or directory the failed operation was on.
    pub path: PathBuf,
    /// The error the operating system reported.
    pub source: io::Error,
}

impl fmt::Display for PathIoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.source)
    }
}

impl std::error::Error for PathIoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Byte offset of slot `no`; the caller has checked that `no` is below the high-water
/// mark, which the file length bounds, so the product cannot overflow.
fn offset_of(no: u64) -> u64 {
    no.checked_mul(PAGE_SIZE_U64)
        .expect("slot numbers below the high-water mark have offsets that fit in u64")
}

impl FileStore {
    /// Opens the store in the file at `path`, creating and initializing it if
    /// `options.create` is set and the file is missing or empty.
    ///
    /// # Errors
    ///
    /// Besides OS errors: an existing file that is not a bfdb file, or was written by
    /// another format version, gives [`super::IncompatibleFile`]; a file whose
    /// superblocks are both invalid, whose free list is damaged, or that is shorter
    /// than its high-water mark gives [`super::CorruptPage`]. An empty file with
    /// `create: false` is [`super::IncompatibleFile`].
    ///
    /// An OS error of this store's file (here and in every later operation) carries a
    /// [`PathIoError`] naming `path`, and the kind of the OS error.
    pub fn open(path: impl AsRef<Path>, options: FileOptions) -> io::Result<FileStore> {
        let path = path.as_ref();
        check_engine(&options)?;
        let (file, direct_io_active) =
            open_file(path, &options).map_err(|e| name_path(Some(path), e))?;
        FileStore::from_parts(file, Some(path.to_path_buf()), direct_io_active, &options)
            .map_err(|e| name_path(Some(path), e))
    }

    /// Builds a store over an already open file, as [`FileStore::open`] does.
    ///
    /// `options.direct_io` is ignored: whether IO is direct follows the flags `file` was
    /// opened with. A file opened read-only opens fine if it is initialized, serves
    /// reads, and is poisoned by its first write.
    pub fn from_file(file: File, options: FileOptions) -> io::Result<FileStore> {
        check_engine(&options)?;
        let direct_io_active = has_o_direct(&file)?;
        FileStore::from_parts(file, None, direct_io_active, &options)
    }

    /// Whether the file is read and written with `O_DIRECT`.
    pub fn direct_io_active(&self) -> bool {
        self.direct_io_active
    }

    /// How data pages are read and written.
    pub fn io_engine(&self) -> IoEngine {
        self.io_engine
    }

    /// The path the store was opened at, if it was opened by path.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Whether an earlier failed write or sync poisoned the store.
    pub fn is_poisoned(&self) -> bool {
        self.poison.is_poisoned()
    }

    /// Names the store's path, if it has one, in an error of its file (see `name_path`).
    fn at_path(&self, e: io::Error) -> io::Error {
        name_path(self.path.as_deref(), e)
    }

    /// Makes the next sync stop at `point`, as if the process crashed there, so tests
    /// can check the crash argument of the sync protocol.
    #[doc(hidden)]
    pub fn set_sync_crash_point_for_test(&self, point: SyncCrashPoint) {
        self.crash_point.store(point as u8, Ordering::Release);
    }

    /// Fails with a simulated crash if a test asked for one at `point`.
    fn crash_here(&self, point: SyncCrashPoint) -> io::Result<()> {
        if self.crash_point.load(Ordering::Acquire) == point as u8 {
            self.crash_point
                .store(SyncCrashPoint::None as u8, Ordering::Release);
            return Err(io::Error::other(format!("simulated crash at {point:?}")));
        }
        Ok(())
    }

    fn from_parts(
        file: File,
        path: Option<PathBuf>,
        direct_io_active: bool,
        options: &FileOptions,
    ) -> io::Result<FileStore> {
        let create = options.create;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "the file is already open in another bfdb store",
                ));
            }
            // Locking is a guard against misuse, not part of the format; a filesystem
            // that cannot lock still stores pages correctly.
            Err(std::fs::TryLockError::Error(_)) => {}
        }
        let len = file.metadata()?.len();
        let state = if len == 0 {
            if !create {
                return Err(incompatible_file(
                    "the file is empty; open it with `create` to initialize a new store",
                ));
            }
            initialize(&file, path.as_deref())?
        } else {
            load(&file, len)?
        };
        Ok(FileStore {
            file,
            path,
            direct_io_active,
            io_engine: options.io_engine,
            sqpoll: options.sqpoll,
            state: RwLock::new(state),
            sync_lock: Mutex::new(()),
            poison: Poison::default(),
            crash_point: AtomicU8::new(SyncCrashPoint::None as u8),
        })
    }

    /// Grows the file so that it covers `pages` slots. Growing never shrinks the file
    /// and every `pwrite` lands below the high-water mark, which this keeps covered, so
    /// the `ftruncate` here can never cut off a concurrent write.
    fn ensure_len(&self, state: &mut AllocState, pages: u64) -> io::Result<()> {
        let want_bytes = offset_of(pages);
        if want_bytes > state.file_len_bytes {
            self.file.set_len(want_bytes).map_err(|e| self.at_path(e))?;
            state.file_len_bytes = want_bytes;
        }
        Ok(())
    }

    /// Decides the new free-list chain and superblock, under the state lock.
    fn plan_sync(&self, st: &mut AllocState) -> io::Result<SyncPlan> {
        let per_page = FREE_LIST_ENTRIES_PER_PAGE;
        let mut entry_count = st.free_recent.len() + st.free_durable.len() + st.chain.len();
        let mut chain = Vec::new();
        let mut new_high_water = st.high_water;
        while chain.len() * per_page < entry_count {
            // A chain page taken from the free slots no longer needs an entry; one past
            // the high-water mark never had one.
            if let Some(no) = st.free_durable.pop_first() {
                entry_count -= 1;
                chain.push(no);
            } else {
                chain.push(new_high_water);
                new_high_water += 1;
            }
        }
        self.ensure_len(st, new_high_water)?;
        st.high_water = new_high_water;
        st.withheld.extend(chain.iter().copied());

        let mut entries: Vec<u64> = st
            .free_durable
            .iter()
            .chain(st.free_recent.iter())
            .chain(st.chain.iter())
            .copied()
            .collect();
        entries.sort_unstable();
        assert_eq!(entries.len(), entry_count);
        assert!(entries.len() <= chain.len() * per_page);

        // Slots freed since the last sync are free in the superblock being written.
        // Until it is durable no other chain is planned (syncs are serialized), and if
        // it never becomes durable the store is poisoned and plans nothing more.
        let mut recent = std::mem::take(&mut st.free_recent);
        st.free_durable.append(&mut recent);
        st.durable_high_water = new_high_water;
        st.dirty = false;

        let superblock = Superblock {
            generation: st.generation + 1,
            high_water: new_high_water,
            free_head: chain.first().copied().unwrap_or(0),
            free_count: entries.len() as u64,
            free_list_pages: chain.len() as u64,
        };
        debug_assert!(superblock.validate(superblock.generation % 2).is_ok());
        Ok(SyncPlan {
            chain,
            entries,
            superblock,
            old_chain: st.chain.clone(),
        })
    }

    /// Writes the planned chain and superblock with the two fsyncs of the protocol.
    fn execute_sync(&self, plan: &SyncPlan) -> io::Result<()> {
        let mut page = Page::boxed();
        let mut chunks = plan.entries.chunks(FREE_LIST_ENTRIES_PER_PAGE);
        for (i, &no) in plan.chain.iter().enumerate() {
            let entries = chunks.next().unwrap_or(&[]);
            let next = plan.chain.get(i + 1).copied().unwrap_or(0);
            page.as_bytes_mut().fill(0);
            let p = page.payload_mut();
            p[FL_NEXT].copy_from_slice(&next.to_le_bytes());
            p[FL_COUNT].copy_from_slice(&(entries.len() as u32).to_le_bytes());
            for (j, entry) in entries.iter().enumerate() {
                let at = FL_ENTRIES_START + 8 * j;
                p[at..at + 8].copy_from_slice(&entry.to_le_bytes());
            }
            page.set_lsn(plan.superblock.generation);
            page.stamp(PageKind::FreeList);
            self.file.write_all_at(page.as_bytes(), offset_of(no))?;
        }
        assert!(chunks.next().is_none(), "the chain holds every entry");
        self.crash_here(SyncCrashPoint::AfterFreeList)?;
        // Data pages, the new chain and the file length become durable before the
        // superblock that points at them.
        self.file.sync_data()?;
        self.crash_here(SyncCrashPoint::BeforeSuperblock)?;
        let sb_page = plan.superblock.to_page();
        let slot = plan.superblock.generation % 2;
        if self.crash_here(SyncCrashPoint::TornSuperblock).is_err() {
            // Only the new header lands on the old copy. (A tear at a later byte would
            // mostly reproduce the new page, since both copies are zero past their
            // fields.) A part-page write is not valid under O_DIRECT, so the tear goes
            // through a read-modify-write of the whole page.
            let mut torn = Page::boxed();
            self.file
                .read_exact_at(torn.as_bytes_mut(), offset_of(slot))?;
            torn.as_bytes_mut()[..PAGE_HEADER_SIZE]
                .copy_from_slice(&sb_page.as_bytes()[..PAGE_HEADER_SIZE]);
            self.file.write_all_at(torn.as_bytes(), offset_of(slot))?;
            return Err(io::Error::other(
                "simulated crash in the middle of a superblock write",
            ));
        }
        self.file
            .write_all_at(sb_page.as_bytes(), offset_of(slot))?;
        self.file.sync_data()
    }
}

/// Writes the two superblocks of a new, empty store and returns its state.
fn initialize(file: &File, path: Option<&Path>) -> io::Result<AllocState> {
    for generation in 0..2 {
        let sb = Superblock {
            generation,
            high_water: FIRST_DATA_SLOT,
            free_head: 0,
            free_count: 0,
            free_list_pages: 0,
        };
        file.write_all_at(sb.to_page().as_bytes(), offset_of(generation))?;
    }
    file.sync_all()?;
    // A new file's directory entry is durable only once its directory is synced.
    if let Some(dir) = path.and_then(Path::parent) {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| name_path(Some(dir), e))?;
    }
    Ok(AllocState {
        high_water: FIRST_DATA_SLOT,
        durable_high_water: FIRST_DATA_SLOT,
        free_recent: BTreeSet::new(),
        free_durable: BTreeSet::new(),
        withheld: BTreeSet::new(),
        chain: Vec::new(),
        generation: 1,
        file_len_bytes: offset_of(FIRST_DATA_SLOT),
        dirty: false,
    })
}

/// Reads the superblocks and the free-list chain of an existing file of `len` bytes.
fn load(file: &File, len: u64) -> io::Result<AllocState> {
    let mut pages = [Page::boxed(), Page::boxed()];
    if len < offset_of(FIRST_DATA_SLOT) {
        // Too short to hold both superblocks. Read what there is (a short read is
        // fine here) to tell a truncated bfdb file from a foreign one.
        let _ = file.read_at(pages[0].as_bytes_mut(), 0)?;
        if pages[0].payload()[SB_MAGIC] == MAGIC {
            return Err(corrupt_page(
                PageNo(0),
                format!("the file is truncated: {len} bytes cannot hold its two superblocks"),
            ));
        }
        return Err(incompatible_file(format!(
            "not a bfdb file: {len} bytes long and no magic bytes"
        )));
    }
    for (slot, page) in pages.iter_mut().enumerate() {
        file.read_exact_at(page.as_bytes_mut(), offset_of(slot as u64))?;
    }
    let copies = [
        classify_superblock(&pages[0], 0),
        classify_superblock(&pages[1], 1),
    ];
    let sb = choose_superblock(copies)?;

    // The high-water mark comes from disk, so its byte size may not even fit in u64.
    let needed_bytes = sb.high_water.saturating_mul(PAGE_SIZE_U64);
    if len < needed_bytes {
        return Err(corrupt_page(
            PageNo(len / PAGE_SIZE_U64),
            format!(
                "the file is truncated: {len} bytes, but its superblock covers {} pages \
                 ({needed_bytes} bytes)",
                sb.high_water
            ),
        ));
    }

    let mut free_durable = BTreeSet::new();
    let mut withheld = BTreeSet::new();
    let mut chain = Vec::new();
    let mut next = sb.free_head;
    let mut page = Page::boxed();
    while next != 0 {
        let no = next;
        let here = PageNo(no);
        if chain.len() as u64 == sb.free_list_pages {
            return Err(corrupt_page(
                here,
                format!(
                    "the free-list chain is longer than the {} pages its superblock records",
                    sb.free_list_pages
                ),
            ));
        }
        if !(FIRST_DATA_SLOT..sb.high_water).contains(&no) || !withheld.insert(no) {
            return Err(corrupt_page(
                PageNo(chain.last().copied().unwrap_or(0)),
                format!("the free-list chain points at page {no}, out of range or a repeat"),
            ));
        }
        chain.push(no);
        file.read_exact_at(page.as_bytes_mut(), offset_of(no))?;
        page.verify(here, PageKind::FreeList)?;
        // Every chain page carries the generation of the superblock that points at it.
        // A page of another generation is a slot that was reused after that superblock
        // was replaced: trusting its entries would free live pages.
        if page.lsn() != sb.generation {
            return Err(corrupt_page(
                here,
                format!(
                    "free-list page of generation {}, but the superblock is generation {}",
                    page.lsn(),
                    sb.generation
                ),
            ));
        }
        let p = page.payload();
        next = le_u64(p, FL_NEXT);
        let count = le_u32(p, FL_COUNT) as usize;
        if count > FREE_LIST_ENTRIES_PER_PAGE {
            return Err(corrupt_page(
                here,
                format!(
                    "free-list page claims {count} entries; at most {FREE_LIST_ENTRIES_PER_PAGE} fit"
                ),
            ));
        }
        for j in 0..count {
            let at = FL_ENTRIES_START + 8 * j;
            let entry = le_u64(p, at..at + 8);
            if !(FIRST_DATA_SLOT..sb.high_water).contains(&entry) || !free_durable.insert(entry) {
                return Err(corrupt_page(
                    here,
                    format!("free-list entry {entry} is out of range or listed twice"),
                ));
            }
        }
    }
    if chain.len() as u64 != sb.free_list_pages || free_durable.len() as u64 != sb.free_count {
        return Err(corrupt_page(
            PageNo(chain.last().copied().unwrap_or(0)),
            format!(
                "the free-list chain has {} pages and {} entries; its superblock records {} \
                 and {}",
                chain.len(),
                free_durable.len(),
                sb.free_list_pages,
                sb.free_count
            ),
        ));
    }
    if let Some(&both) = free_durable.intersection(&withheld).next() {
        return Err(corrupt_page(
            PageNo(both),
            "a free-list page lists itself or another free-list page as free",
        ));
    }

    // Slots past the durable high-water mark were allocated after the last sync; the
    // durable state does not know them, so they are free. A partial page at the end
    // (from a short write when the disk filled up) lies past the mark too and is
    // treated as a free slot: the first write to it completes it.
    let file_pages = len.div_ceil(PAGE_SIZE_U64);
    free_durable.extend(sb.high_water..file_pages);
    Ok(AllocState {
        high_water: file_pages,
        durable_high_water: sb.high_water,
        free_recent: BTreeSet::new(),
        free_durable,
        withheld,
        chain,
        generation: sb.generation,
        file_len_bytes: len,
        dirty: false,
    })
}

impl FileStore {
    /// Reads data pages through io_uring, all in one batch, then verifies each.
    fn read_pages_uring(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        {
            let st = self.state.read();
            if let Some((no, _)) = reqs.iter().find(|(no, _)| !st.is_allocated(no.0)) {
                return Err(not_allocated(*no, "read"));
            }
        }
        let fd = self.file.as_raw_fd();
        super::uring::submit_pages(fd, Direction::Read, self.sqpoll, reqs)
            .map_err(|(i, e)| self.at_path(unwritten(reqs[i].0, e)))?;
        for (no, page) in reqs.iter() {
            page.verify(*no, PageKind::Data)?;
        }
        Ok(())
    }

    /// Stamps and writes data pages through io_uring, all in one batch.
    fn write_pages_uring(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        self.poison.check()?;
        {
            let st = self.state.read();
            if let Some((no, _)) = reqs.iter().find(|(no, _)| !st.is_allocated(no.0)) {
                return Err(not_allocated(*no, "write"));
            }
        }
        for (_, page) in reqs.iter_mut() {
            page.stamp(PageKind::Data);
        }
        let fd = self.file.as_raw_fd();
        super::uring::submit_pages(fd, Direction::Write, self.sqpoll, reqs)
            .map_err(|(_, e)| self.poison.poison(self.at_path(e)))
    }
}

impl Drop for FileStore {
    /// Releases the `flock` explicitly, before the descriptor closes. Closing alone does
    /// not always release it at once: a `flock` lives until the last reference to the
    /// open file goes, and io_uring's kernel workers, which take references for the
    /// requests they carry out, drop theirs through the kernel's deferred file release,
    /// a moment after the request completed. A store opened on the same file right after
    /// this one was dropped then failed with "already open" (seen in the buffered
    /// io_uring model test). Every request of this store has completed by now (page IO
    /// returns only once its batch is reaped), so nothing still relies on the lock.
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

impl PageStore for FileStore {
    fn raw_page_location(&self, no: PageNo) -> Option<(std::os::fd::RawFd, u64)> {
        use std::os::fd::AsRawFd;
        self.state
            .read()
            .is_allocated(no.0)
            .then(|| (self.file.as_raw_fd(), offset_of(no.0)))
    }

    fn read_page(&self, no: PageNo, page: &mut Page) -> io::Result<()> {
        if self.io_engine == IoEngine::IoUring {
            return self.read_pages_uring(&mut [(no, page)]);
        }
        if !self.state.read().is_allocated(no.0) {
            return Err(not_allocated(no, "read"));
        }
        self.file
            .read_exact_at(page.as_bytes_mut(), offset_of(no.0))
            .map_err(|e| self.at_path(unwritten(no, e)))?;
        page.verify(no, PageKind::Data)
    }

    fn write_page(&self, no: PageNo, page: &mut Page) -> io::Result<()> {
        if self.io_engine == IoEngine::IoUring {
            return self.write_pages_uring(&mut [(no, page)]);
        }
        self.poison.check()?;
        if !self.state.read().is_allocated(no.0) {
            return Err(not_allocated(no, "write"));
        }
        page.stamp(PageKind::Data);
        self.file
            .write_all_at(page.as_bytes(), offset_of(no.0))
            .map_err(|e| self.poison.poison(self.at_path(e)))
    }

    fn read_pages(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        if self.io_engine == IoEngine::IoUring {
            return self.read_pages_uring(reqs);
        }
        for (no, page) in reqs.iter_mut() {
            self.read_page(*no, page)?;
        }
        Ok(())
    }

    fn write_pages(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        if self.io_engine == IoEngine::IoUring {
            return self.write_pages_uring(reqs);
        }
        for (no, page) in reqs.iter_mut() {
            self.write_page(*no, page)?;
        }
        Ok(())
    }

    fn allocate(&self) -> io::Result<PageNo> {
        self.poison.check()?;
        let mut st = self.state.write();
        // Reusing slots freed since the last sync first keeps the durably free ones
        // available for the next free-list chain, which may only use those; the file
        // then needs less slack before churn stops growing it.
        if let Some(no) = st.free_recent.pop_first() {
            st.dirty = true;
            return Ok(PageNo(no));
        }
        if let Some(no) = st.free_durable.pop_first() {
            st.dirty = true;
            return Ok(PageNo(no));
        }
        let no = st.high_water;
        self.ensure_len(&mut st, no + 1)?;
        st.high_water = no + 1;
        st.dirty = true;
        Ok(PageNo(no))
    }

    fn free(&self, no: PageNo) -> io::Result<()> {
        self.poison.check()?;
        let mut st = self.state.write();
        if !st.is_allocated(no.0) {
            return Err(not_allocated(no, "free"));
        }
        if no.0 >= st.durable_high_water {
            st.free_durable.insert(no.0);
        } else {
            st.free_recent.insert(no.0);
        }
        st.dirty = true;
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.poison.check()?;
        let _serial = self.sync_lock.lock();
        self.poison.check()?;
        let plan = {
            let mut st = self.state.write();
            if st.dirty {
                Some(
                    self.plan_sync(&mut st)
                        .map_err(|e| self.poison.poison(self.at_path(e)))?,
                )
            } else {
                None
            }
        };
        let Some(plan) = plan else {
            // The allocation state on disk is current; only data writes need flushing.
            return self
                .file
                .sync_data()
                .map_err(|e| self.poison.poison(self.at_path(e)));
        };
        self.execute_sync(&plan)
            .map_err(|e| self.poison.poison(self.at_path(e)))?;
        let mut st = self.state.write();
        for no in &plan.old_chain {
            let was_withheld = st.withheld.remove(no);
            assert!(was_withheld, "old free-list page {no} was withheld");
            st.free_durable.insert(*no);
        }
        st.chain = plan.chain.clone();
        st.generation = plan.superblock.generation;
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        match self.file.metadata() {
            Ok(m) => m.len(),
            Err(_) => self.state.read().file_len_bytes,
        }
    }

    fn stats(&self) -> StoreStats {
        let st = self.state.read();
        let free_pages = st.free_pages();
        let free_list_pages = st.withheld.len() as u64;
        StoreStats {
            live_pages: st.high_water - FIRST_DATA_SLOT - free_pages - free_list_pages,
            free_pages,
            free_list_pages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(generation: u64) -> Superblock {
        Superblock {
            generation,
            high_water: 10,
            free_head: 3,
            free_count: 4,
            free_list_pages: 1,
        }
    }

    #[test]
    fn superblock_round_trips() {
        let sb = valid(7);
        let page = sb.to_page();
        match classify_superblock(&page, 1) {
            SuperblockCopy::Valid(back) => assert_eq!(back, sb),
            other => panic!("expected valid, got {other:?}"),
        }
        // The same bytes in the wrong slot are inconsistent.
        assert!(matches!(
            classify_superblock(&page, 0),
            SuperblockCopy::Corrupt(_)
        ));
    }

    #[test]
    fn superblock_validation_rejects_inconsistent_fields() {
        let cases = [
            Superblock {
                high_water: 1,
                ..valid(1)
            },
            Superblock {
                free_head: 0,
                ..valid(1)
            },
            Superblock {
                free_head: 10,
                ..valid(1)
            },
            Superblock {
                free_count: 9,
                ..valid(1)
            },
            Superblock {
                free_count: u64::MAX,
                ..valid(1)
            },
            Superblock {
                free_count: 600,
                high_water: 1000,
                ..valid(1)
            },
        ];
        for sb in cases {
            assert!(sb.validate(1).is_err(), "{sb:?}");
        }
        assert!(valid(1).validate(1).is_ok());
    }

    #[test]
    fn newest_valid_copy_wins_and_other_format_is_refused() {
        let chosen = choose_superblock([
            SuperblockCopy::Valid(valid(4)),
            SuperblockCopy::Valid(valid(5)),
        ])
        .unwrap();
        assert_eq!(chosen.generation, 5);
        let chosen = choose_superblock([
            SuperblockCopy::Valid(valid(4)),
            SuperblockCopy::Corrupt("torn".into()),
        ])
        .unwrap();
        assert_eq!(chosen.generation, 4);
        let err = choose_superblock([
            SuperblockCopy::Valid(valid(4)),
            SuperblockCopy::OtherFormat("v2".into()),
        ])
        .unwrap_err();
        assert!(
            err.get_ref()
                .unwrap()
                .is::<super::super::IncompatibleFile>()
        );
        let err =
            choose_superblock([SuperblockCopy::Foreign, SuperblockCopy::Foreign]).unwrap_err();
        assert!(
            err.get_ref()
                .unwrap()
                .is::<super::super::IncompatibleFile>()
        );
        let err = choose_superblock([
            SuperblockCopy::Foreign,
            SuperblockCopy::Corrupt("torn".into()),
        ])
        .unwrap_err();
        let c = err
            .get_ref()
            .unwrap()
            .downcast_ref::<super::super::CorruptPage>()
            .unwrap();
        assert_eq!(c.page, 1);
    }
}
