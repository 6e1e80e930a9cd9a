//! A page store in one file, read and written with `pread`/`pwrite` or io_uring,
//! optionally with `O_DIRECT`: [`FileStore`], the front door of the file backend.
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
//! The parts, one concept to a file:
//!
//! - `superblock`: the superblock's layout, encoding, decoding and validation, and the
//!   choice between its two copies.
//! - `freelist`: the in-memory allocation state and the free-list pages that persist it.
//! - `sync`: the commit protocol that writes a new chain and superblock.
//! - `engine`: opening the file (`O_DIRECT`), data-page IO on `pread`/`pwrite` or
//!   io_uring, and OS errors that name the file.
//!
//! This module holds [`FileStore`] itself: opening and loading, allocation and free,
//! and the [`PageStore`] implementation that hands data-page IO to the engine.
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
//!
//! # Invariants this module owns
//!
//! - The file's length always covers the high-water mark: `allocate` extends the file
//!   before it hands out a slot past its end, and nothing ever shrinks it.
//! - While the store is open its file is `flock`ed exclusively (where the filesystem
//!   supports `flock`), so two stores never share one file.
//! - A store opened on an empty file with `create` writes both superblocks and syncs
//!   the file and its directory before it is used.

mod engine;
mod freelist;
mod superblock;
mod sync;

use std::fmt;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{
    PAGE_SIZE, Page, PageNo, PageStore, Poison, StoreStats, corrupt_page, incompatible_file,
    not_allocated,
};
use crate::sync::atomic::AtomicU8;
use crate::sync::{Mutex, RwLock};

use engine::{check_engine, has_o_direct, open_file};
pub(crate) use engine::{name_path, open_maybe_direct};
use freelist::AllocState;
use superblock::Superblock;

pub use engine::{IoEngine, PathIoError, simulate_o_direct_refused_for_test};
pub use freelist::FREE_LIST_ENTRIES_PER_PAGE;
pub use sync::SyncCrashPoint;

/// Slots 0 and 1 hold the two superblock copies; data slots start here.
const FIRST_DATA_SLOT: u64 = 2;

/// `PAGE_SIZE` as a `u64`, for offset arithmetic.
const PAGE_SIZE_U64: u64 = PAGE_SIZE as u64;

/// When the file grows past the disk blocks reserved for it, blocks are reserved for
/// this share of its length beyond what it needs (`FileStore::reserve_ahead`), within
/// the two bounds below: a 380 MiB file reserves ~6 MiB (1,500 slots) at a time.
const RESERVE_AHEAD_DIVISOR: u64 = 64;
const RESERVE_AHEAD_MIN_BYTES: u64 = 1 << 20;
const RESERVE_AHEAD_MAX_BYTES: u64 = 16 << 20;

/// Byte offset of slot `no`; the caller has checked that `no` is below the high-water
/// mark, which the file length bounds, so the product cannot overflow.
fn offset_of(no: u64) -> u64 {
    no.checked_mul(PAGE_SIZE_U64)
        .expect("slot numbers below the high-water mark have offsets that fit in u64")
}

/// The little-endian `u64` at `range` of `bytes`; `None` if `bytes` is too short or the
/// range is not 8 bytes long. The decoders of bytes from disk read every field this way.
fn le_u64(bytes: &[u8], range: Range<usize>) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(range)?.try_into().ok()?))
}

/// The little-endian `u32` at `range` of `bytes`, as [`le_u64`].
fn le_u32(bytes: &[u8], range: Range<usize>) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(range)?.try_into().ok()?))
}

/// The little-endian `u16` at `range` of `bytes`, as [`le_u64`].
fn le_u16(bytes: &[u8], range: Range<usize>) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(range)?.try_into().ok()?))
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

    /// Makes every data write so far durable (`fdatasync`) without persisting the
    /// allocation state: for a client that keeps its own record of which slots are in
    /// use (the database's checkpoints) and never calls [`PageStore::sync`], whose free
    /// list it would not trust anyway.
    pub fn sync_data(&self) -> io::Result<()> {
        self.poison.check()?;
        self.file
            .sync_data()
            .map_err(|e| self.poison.poison(self.at_path(e)))
    }

    /// Makes exactly the slots `live` allocated and every other data slot free, growing
    /// the file to cover the highest: how a client that keeps its own record of the
    /// slots in use (see [`FileStore::sync_data`]) takes over a store it opened. Slots of
    /// the durable free-list chain stay withheld; one of them in `live` is an error, as
    /// is a slot below the first data slot.
    pub fn set_allocated(&self, live: &std::collections::BTreeSet<u64>) -> io::Result<()> {
        self.poison.check()?;
        let mut st = self.state.write();
        if let Some(&no) = live
            .iter()
            .find(|&&no| no < FIRST_DATA_SLOT || st.withheld.contains(&no))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot {no} cannot hold client data"),
            ));
        }
        let top = live.last().map_or(FIRST_DATA_SLOT, |&no| no + 1);
        let high_water = st.high_water.max(top);
        self.ensure_len(&mut st, high_water)?;
        st.high_water = high_water;
        // As `free` sorts them: below the durable high-water mark the durable state may
        // call a slot allocated, so it is never used for a free-list chain.
        let free: Vec<u64> = (FIRST_DATA_SLOT..high_water)
            .filter(|no| !live.contains(no) && !st.withheld.contains(no))
            .collect();
        let durable_high_water = st.durable_high_water;
        st.free_recent = free
            .iter()
            .copied()
            .filter(|&no| no < durable_high_water)
            .collect();
        st.free_durable = free
            .into_iter()
            .filter(|&no| no >= durable_high_water)
            .collect();
        st.dirty = true;
        Ok(())
    }

    /// Grows the file so that it covers `pages` slots. Growing never shrinks the file
    /// and every `pwrite` lands below the high-water mark, which this keeps covered, so
    /// the `ftruncate` here can never cut off a concurrent write.
    fn ensure_len(&self, state: &mut AllocState, pages: u64) -> io::Result<()> {
        let want_bytes = offset_of(pages);
        if want_bytes > state.file_len_bytes {
            if want_bytes > state.reserved_bytes {
                self.reserve_ahead(state, want_bytes);
            }
            self.file.set_len(want_bytes).map_err(|e| self.at_path(e))?;
            state.file_len_bytes = want_bytes;
        }
        Ok(())
    }

    /// Reserves disk blocks past the file's end, through `want_bytes` and a share of the
    /// file beyond it, without changing the file's length (`FALLOC_FL_KEEP_SIZE`).
    ///
    /// Why: the `ftruncate` that grows the file leaves the new slots as a hole, and a
    /// direct write into a hole must allocate blocks. ext4 does that only with the inode
    /// lock held exclusively and never without blocking, so io_uring, whose first try of
    /// a write may not block, hands every such write to a kernel worker thread. A `Db`
    /// whose checkpoint pinned every page writes each page's next version to a new
    /// slot, so after a checkpoint about half its leaf writes went that way: at 10M
    /// records those workers took 0.41-0.48 µs of CPU per update, and the writers lost
    /// more to the switches (docs/benchmarks-history.md). A write into reserved blocks is an
    /// overwrite as far as the lock and io_uring are concerned. Nothing about the slots
    /// changes: reserved blocks lie past the file's length until `set_len` covers them,
    /// read as zeros, and a reopen does not see them. A failure (a filesystem without `fallocate`, a
    /// full disk) is ignored: writes then allocate their blocks as they did without it.
    fn reserve_ahead(&self, state: &mut AllocState, want_bytes: u64) {
        let ahead = (want_bytes / RESERVE_AHEAD_DIVISOR)
            .clamp(RESERVE_AHEAD_MIN_BYTES, RESERVE_AHEAD_MAX_BYTES);
        let until = (want_bytes + ahead).next_multiple_of(PAGE_SIZE_U64);
        let from = state.reserved_bytes.max(state.file_len_bytes);
        #[cfg(target_os = "linux")]
        if let (Ok(offset), Ok(len)) = (
            libc::off_t::try_from(from),
            libc::off_t::try_from(until - from),
        ) {
            use std::os::fd::AsRawFd;
            // SAFETY: the descriptor belongs to `self.file`, open for the whole call, and
            // fallocate takes no pointer argument, so the call touches no memory of ours.
            let _ = unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    libc::FALLOC_FL_KEEP_SIZE,
                    offset,
                    len,
                )
            };
        }
        // Also after a failure: the next try comes a whole share of the file later, so
        // a filesystem that refuses costs one call per share, not one per slot.
        state.reserved_bytes = until;
    }
}

/// Writes the two superblocks of a new, empty store and returns its state.
fn initialize(file: &File, path: Option<&Path>) -> io::Result<AllocState> {
    for generation in 0..2 {
        let sb = Superblock::empty(generation);
        file.write_all_at(sb.to_page().as_bytes(), offset_of(sb.slot()))?;
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
    Ok(AllocState::empty())
}

/// Reads the superblocks and the free-list chain of an existing file of `len` bytes.
fn load(file: &File, len: u64) -> io::Result<AllocState> {
    let sb = superblock::read_superblock(file, len)?;
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
    freelist::load_state(file, len, sb.chain())
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

impl super::SlotStore for FileStore {
    fn sync_data(&self) -> io::Result<()> {
        FileStore::sync_data(self)
    }

    fn set_allocated(&self, live: &std::collections::BTreeSet<u64>) -> io::Result<()> {
        FileStore::set_allocated(self, live)
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
        self.read_data(no, page)
    }

    fn write_page(&self, no: PageNo, page: &mut Page) -> io::Result<()> {
        self.write_data(no, page)
    }

    fn read_pages(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        self.read_data_batch(reqs)
    }

    fn write_pages(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        self.write_data_batch(reqs)
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
        self.sync_store()
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
