//! The storage layer: every byte of disk IO in bfdb goes through it, as pages of a
//! [`PageStore`] (this module), segments of a [`LogDevice`] (`log`), or blocks of a
//! block device (`blocks`: the hash logs' segment files). It owns alignment, `O_DIRECT`,
//! io_uring and checksums; it uses nothing of the crate but the `sync` shim.
//!
//! # Page stores
//!
//! A page store hands out 4 KiB page *slots*, identified by a [`PageNo`], and reads
//! and writes whole [`Page`]s at them. It never knows what a page contains: the first
//! [`PAGE_HEADER_SIZE`] bytes of every page are the store's own header, and the
//! remaining [`PAGE_PAYLOAD_SIZE`] bytes belong to the client.
//!
//! # Page header
//!
//! Bytes `0..16` of every page, all integers little-endian:
//!
//! ```text
//! 0..4    crc32c of bytes 4..4096
//! 4..6    format version (FORMAT_VERSION)
//! 6..8    page kind: 1 = data (client page), 2 = superblock, 3 = free-list page
//! 8..16   lsn: the log sequence number the page reflects; set by the client
//! ```
//!
//! [`PageStore::write_page`] stamps version, kind and checksum; [`PageStore::read_page`]
//! verifies all three. A torn or bit-rotted page therefore surfaces as an error carrying
//! [`CorruptPage`], never as silently wrong bytes.
//!
//! # Invariants this module owns
//!
//! - A page handed to a client by `read_page` passed its checksum, carries
//!   [`FORMAT_VERSION`] and is of kind data.
//! - Reading, writing or freeing a slot that is not allocated is an
//!   [`io::ErrorKind::InvalidInput`] error, never a panic and never a write to a slot the
//!   store uses for itself.
//! - After a failed write or sync a store is *poisoned*: writes, allocations, frees and
//!   syncs fail with [`StorePoisoned`]; reads still work. Reopen the store to continue.
//!
//! # Errors
//!
//! All operations return [`io::Result`]. The storage layer's typed failures travel inside
//! an `io::Error` of kind [`io::ErrorKind::InvalidData`] so that `bfdb::Error` can lift
//! them back into its own variants: [`CorruptPage`] becomes `Error::Corrupted` and
//! [`IncompatibleFile`] becomes `Error::Incompatible`. An OS error of a file store opened
//! by path carries a [`PathIoError`] naming the file, under the OS error's own kind.

use std::fmt;
use std::io;

#[cfg(feature = "tokio-uring")]
mod aio;
mod backend;
mod blocks;
mod file;
mod log;
mod memory;
mod shadow;
mod sim;
pub mod uring;
pub(crate) mod values;
mod window;

#[cfg(feature = "tokio-uring")]
pub(crate) use aio::read_on_ring;
#[cfg(feature = "tokio-uring")]
pub use aio::{AsyncPageReader, ReadPath};
pub(crate) use backend::{ActiveBackend, IoRequest, IoUringUse, OpenError, open_with_fallback};
#[cfg(test)]
pub(crate) use blocks::MemBlocks;
pub(crate) use blocks::{
    AlignedBuf, BlockDevice, IO_ALIGN_BYTES, OWN_MAPPING_BYTES, Retaining, SegmentFiles,
};
pub(crate) use file::name_path;
pub use file::{
    FREE_LIST_ENTRIES_PER_PAGE, FileOptions, FileStore, IoEngine, PathIoError, SyncCrashPoint,
    simulate_o_direct_refused_for_test,
};
pub use log::{DirLog, LOG_BLOCK_BYTES, LogDevice, SimLog};
pub use memory::MemoryStore;
pub use shadow::{PinSet, ShadowStore};
pub use sim::{SimBlocks, SimCounts, SimFault, SimOp, SimPages, SimStore};
pub(crate) use values::{
    READ_DELAY_MICROS, ReadGuard, ValueCache, ValueRef, ValueStore, value_files,
};
pub(crate) use window::ReadWindow;

/// A page store a database keeps a keyspace's pages in: besides page IO, it makes page
/// writes durable without persisting its own allocation state, and takes the set of
/// slots in use from its client, whose checkpoints are the record of which slots hold
/// what ([`ShadowStore`] is that client).
pub trait SlotStore: PageStore {
    /// Makes every page write so far durable, and nothing else: the store's own record
    /// of free slots is not written (for a file, an `fdatasync`).
    fn sync_data(&self) -> io::Result<()>;

    /// Makes exactly the slots in `live` allocated and every other slot free, as a
    /// client recovering from its own record of the slots in use does right after
    /// opening the store.
    fn set_allocated(&self, live: &std::collections::BTreeSet<u64>) -> io::Result<()>;
}

/// Size of one page in bytes: the unit of every read and write.
pub const PAGE_SIZE: usize = 4096;

/// Bytes of a disk sector: the unit a power cut tears writes at, and the smallest read
/// alignment a block device may allow.
pub(crate) const SECTOR_BYTES: usize = 512;

/// Size of the store's header at the start of every page.
pub const PAGE_HEADER_SIZE: usize = 16;

/// Bytes of a page that belong to the client: everything after the header.
pub const PAGE_PAYLOAD_SIZE: usize = PAGE_SIZE - PAGE_HEADER_SIZE;

/// The on-disk format version this build reads and writes.
pub const FORMAT_VERSION: u16 = 1;

/// Byte offsets of the page header fields.
const CRC_RANGE: std::ops::Range<usize> = 0..4;
const VERSION_RANGE: std::ops::Range<usize> = 4..6;
const KIND_RANGE: std::ops::Range<usize> = 6..8;
const LSN_RANGE: std::ops::Range<usize> = 8..16;

// The header fields tile bytes 0..PAGE_HEADER_SIZE with no gap and no overlap.
const _: () = assert!(CRC_RANGE.start == 0);
const _: () = assert!(CRC_RANGE.end == VERSION_RANGE.start);
const _: () = assert!(VERSION_RANGE.end == KIND_RANGE.start);
const _: () = assert!(KIND_RANGE.end == LSN_RANGE.start);
const _: () = assert!(LSN_RANGE.end == PAGE_HEADER_SIZE);

/// A page number; its byte offset in a file is `no * PAGE_SIZE`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct PageNo(pub u64);

impl fmt::Display for PageNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What a page holds, as recorded in bytes `6..8` of its header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u16)]
pub(crate) enum PageKind {
    /// A client page: the only kind `read_page` hands out.
    Data = 1,
    /// One of the two superblock copies of a file store.
    Superblock = 2,
    /// A page of a file store's persisted free-list chain.
    FreeList = 3,
}

/// One 4 KiB page, aligned to 4096 bytes so it can be the buffer of an `O_DIRECT` read
/// or write as it is.
#[repr(C, align(4096))]
pub struct Page {
    bytes: [u8; PAGE_SIZE],
}

const _: () = assert!(size_of::<Page>() == PAGE_SIZE);
const _: () = assert!(align_of::<Page>() == PAGE_SIZE);

impl Page {
    /// A page of zero bytes.
    pub fn zeroed() -> Page {
        Page {
            bytes: [0; PAGE_SIZE],
        }
    }

    /// A zeroed page on the heap, allocated zeroed in place rather than built on the
    /// stack and moved.
    pub fn boxed() -> Box<Page> {
        let uninit = Box::<Page>::new_zeroed();
        // SAFETY: `Page` is a byte array and nothing else, so the all-zero bit pattern
        // that `new_zeroed` wrote is a valid `Page`.
        unsafe { uninit.assume_init() }
    }

    /// The client's bytes: everything after the header (`PAGE_PAYLOAD_SIZE` bytes).
    pub fn payload(&self) -> &[u8] {
        &self.bytes[PAGE_HEADER_SIZE..]
    }

    /// The client's bytes, mutably.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[PAGE_HEADER_SIZE..]
    }

    /// The log sequence number stored in the header.
    pub fn lsn(&self) -> u64 {
        u64::from_le_bytes(self.bytes[LSN_RANGE].try_into().expect("8-byte range"))
    }

    /// Sets the log sequence number in the header; the store writes it unchanged.
    pub fn set_lsn(&mut self, lsn: u64) {
        self.bytes[LSN_RANGE].copy_from_slice(&lsn.to_le_bytes());
    }

    /// All bytes of the page, header included.
    pub fn as_bytes(&self) -> &[u8; PAGE_SIZE] {
        &self.bytes
    }

    /// All bytes of the page, header included, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8; PAGE_SIZE] {
        &mut self.bytes
    }

    /// The checksum field of the header.
    fn stored_crc(&self) -> u32 {
        u32::from_le_bytes(self.bytes[CRC_RANGE].try_into().expect("4-byte range"))
    }

    /// The format version field of the header.
    fn version(&self) -> u16 {
        u16::from_le_bytes(self.bytes[VERSION_RANGE].try_into().expect("2-byte range"))
    }

    /// The raw kind field of the header.
    fn kind_raw(&self) -> u16 {
        u16::from_le_bytes(self.bytes[KIND_RANGE].try_into().expect("2-byte range"))
    }

    /// The checksum the page's current bytes should carry.
    fn computed_crc(&self) -> u32 {
        crc32c::crc32c(&self.bytes[CRC_RANGE.end..])
    }

    /// Writes version, `kind` and the checksum over everything else into the header.
    /// The lsn and payload are left as the client set them.
    pub(crate) fn stamp(&mut self, kind: PageKind) {
        self.bytes[VERSION_RANGE].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        self.bytes[KIND_RANGE].copy_from_slice(&(kind as u16).to_le_bytes());
        let crc = self.computed_crc();
        self.bytes[CRC_RANGE].copy_from_slice(&crc.to_le_bytes());
        debug_assert!(self.verify(PageNo(0), kind).is_ok());
    }

    /// Checks checksum, version and kind of a page read from slot `no`.
    ///
    /// A checksum mismatch is corruption. A page whose checksum holds but whose version
    /// differs was written by another format version: that is an incompatible file, not
    /// corruption. A valid page of another kind than `expected` is corruption of the
    /// store's bookkeeping, since the store only reads slots whose kind it knows.
    pub(crate) fn verify(&self, no: PageNo, expected: PageKind) -> io::Result<()> {
        let stored = self.stored_crc();
        let computed = self.computed_crc();
        if stored != computed {
            let reason = if self.bytes.iter().all(|&b| b == 0) {
                "page is all zeros: it was never written, or its write was lost".to_string()
            } else {
                format!("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")
            };
            return Err(corrupt_page(no, reason));
        }
        let version = self.version();
        if version != FORMAT_VERSION {
            return Err(incompatible_file(format!(
                "page {no} has format version {version}; this build understands version \
                 {FORMAT_VERSION}"
            )));
        }
        let kind = self.kind_raw();
        if kind != expected as u16 {
            return Err(corrupt_page(
                no,
                format!(
                    "page kind is {kind}, expected {} ({expected:?})",
                    expected as u16
                ),
            ));
        }
        Ok(())
    }
}

impl Clone for Page {
    fn clone(&self) -> Self {
        Page { bytes: self.bytes }
    }
}

impl Default for Page {
    fn default() -> Self {
        Page::zeroed()
    }
}

impl fmt::Debug for Page {
    /// Shows the header fields only; 4 KiB of bytes help nobody in a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Page")
            .field("crc", &format_args!("{:#010x}", self.stored_crc()))
            .field("version", &self.version())
            .field("kind", &self.kind_raw())
            .field("lsn", &self.lsn())
            .finish_non_exhaustive()
    }
}

/// Counts describing a store's slots.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[non_exhaustive]
pub struct StoreStats {
    /// Slots currently allocated to the client.
    pub live_pages: u64,
    /// Slots free for [`PageStore::allocate`] to hand out right now.
    pub free_pages: u64,
    /// Slots holding the durable free list of a file store; they are free in substance
    /// but withheld from allocation until the next sync writes a new list. Always 0 for
    /// the memory store.
    pub free_list_pages: u64,
}

/// The one interface through which bfdb reads and writes pages.
///
/// Implementations are shared between threads: operations on different pages proceed
/// concurrently. The caller must not free a page while another of its own operations on
/// that page is in flight; the store stays memory-safe if it does, but the outcome of the
/// racing operations is unspecified.
///
/// Reading a slot that was allocated but not yet written in its current allocation
/// returns an error or the bytes of an earlier use of the slot; clients write a page
/// before they read it.
pub trait PageStore: Send + Sync + fmt::Debug {
    /// Reads page `no`, verifying checksum and format version (Err(CorruptPage) on mismatch).
    ///
    /// A slot that is not allocated gives [`io::ErrorKind::InvalidInput`].
    fn read_page(&self, no: PageNo, page: &mut Page) -> io::Result<()>;

    /// Stamps the header (version, kind, checksum) into `page`, then writes it.
    ///
    /// The lsn in the header is written as the caller set it. A slot that is not
    /// allocated gives [`io::ErrorKind::InvalidInput`]; a failed write poisons the store.
    fn write_page(&self, no: PageNo, page: &mut Page) -> io::Result<()>;

    /// Reads several pages, verifying each as [`PageStore::read_page`] does.
    ///
    /// A store that can keep many reads in flight (a [`FileStore`] on
    /// [`IoEngine::IoUring`]) submits them together; the default reads them one after
    /// the other. On error the result is that of one failed page (the first in `reqs`
    /// order, for the stores of this crate) and which other pages were read is
    /// unspecified: the default stops at the first error, a batched store finishes every
    /// read it submitted.
    fn read_pages(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        for (no, page) in reqs.iter_mut() {
            self.read_page(*no, page)?;
        }
        Ok(())
    }

    /// Stamps and writes several pages, as [`PageStore::write_page`] does for each.
    ///
    /// A store that can keep many writes in flight submits them together; the default
    /// writes them one after the other. The writes are not ordered among themselves. On
    /// error which other pages were written is unspecified (the default stops at the
    /// first error; a batched store finishes every write it submitted), and the store is
    /// poisoned as after any failed write.
    fn write_pages(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        for (no, page) in reqs.iter_mut() {
            self.write_page(*no, page)?;
        }
        Ok(())
    }

    /// Where page `no` lives in a plain file, for callers that submit their own reads
    /// (an async read path): the file's descriptor and the page's byte offset,
    /// or `None` (the default) when the store keeps pages elsewhere or `no` is not an
    /// allocated data page. Callers then use [`PageStore::read_page`]. The descriptor is
    /// the store's and stays open as long as the store: never close it. A caller reading
    /// through it must verify the page itself (checksum, version, kind), as `read_page`
    /// does; within bfdb the only such caller is the storage layer's own async reader
    /// (`AsyncPageReader`, feature `tokio-uring`).
    #[cfg(unix)]
    fn raw_page_location(&self, no: PageNo) -> Option<(std::os::fd::RawFd, u64)> {
        let _ = no;
        None
    }

    /// A page slot for new data: a freed slot if any, else a new one at the end.
    fn allocate(&self) -> io::Result<PageNo>;

    /// Gives a slot back for reuse.
    ///
    /// Freeing a slot that is not allocated gives [`io::ErrorKind::InvalidInput`].
    fn free(&self, no: PageNo) -> io::Result<()>;

    /// `n` consecutive page slots for one unit of data larger than a page (a tree's
    /// leaf of `n` pages): the first of them. `n == 1` is [`PageStore::allocate`]; a
    /// store that cannot keep runs (the default, for `n > 1`) gives
    /// [`io::ErrorKind::Unsupported`].
    fn allocate_run(&self, n: usize) -> io::Result<PageNo> {
        if n == 1 {
            return self.allocate();
        }
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("this page store keeps single pages, not runs of {n}"),
        ))
    }

    /// Gives back the run of `n` slots from `first` that [`PageStore::allocate_run`]
    /// handed out.
    fn free_run(&self, first: PageNo, n: usize) -> io::Result<()> {
        if n == 1 {
            return self.free(first);
        }
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("this page store keeps single pages, not runs of {n}"),
        ))
    }

    /// Makes every write and the allocation state durable (fsync / fdatasync).
    ///
    /// Writes and allocation changes that completed before the call are covered;
    /// operations running concurrently with it may or may not be.
    fn sync(&self) -> io::Result<()>;

    /// Bytes the store occupies (file length for files, page bytes held for memory).
    fn size_bytes(&self) -> u64;

    /// Counts of live pages and free slots.
    fn stats(&self) -> StoreStats;
}

/// A shared store is a store: lets a caller keep a handle (say, to a
/// [`SimStore`] whose faults it arms) while a tree owns another.
impl<S: PageStore + ?Sized> PageStore for std::sync::Arc<S> {
    fn read_page(&self, no: PageNo, page: &mut Page) -> io::Result<()> {
        (**self).read_page(no, page)
    }
    fn write_page(&self, no: PageNo, page: &mut Page) -> io::Result<()> {
        (**self).write_page(no, page)
    }
    fn read_pages(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        (**self).read_pages(reqs)
    }
    fn write_pages(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        (**self).write_pages(reqs)
    }
    #[cfg(unix)]
    fn raw_page_location(&self, no: PageNo) -> Option<(std::os::fd::RawFd, u64)> {
        (**self).raw_page_location(no)
    }
    fn allocate(&self) -> io::Result<PageNo> {
        (**self).allocate()
    }
    fn free(&self, no: PageNo) -> io::Result<()> {
        (**self).free(no)
    }
    fn allocate_run(&self, n: usize) -> io::Result<PageNo> {
        (**self).allocate_run(n)
    }
    fn free_run(&self, first: PageNo, n: usize) -> io::Result<()> {
        (**self).free_run(first, n)
    }
    fn sync(&self) -> io::Result<()> {
        (**self).sync()
    }
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }
    fn stats(&self) -> StoreStats {
        (**self).stats()
    }
}

/// The detail inside an `io::Error` that reports a page failing verification.
///
/// It travels as `io::Error::new(io::ErrorKind::InvalidData, CorruptPage { .. })` and
/// becomes `bfdb::Error::Corrupted` when converted.
#[derive(Debug, Clone)]
pub struct CorruptPage {
    /// The page number at which the corruption was found.
    pub page: u64,
    /// What was wrong with the page, in words.
    pub reason: String,
}

impl fmt::Display for CorruptPage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "page {} is corrupted: {}", self.page, self.reason)
    }
}

impl std::error::Error for CorruptPage {}

/// The detail inside an `io::Error` that reports a file this build cannot read: not a
/// bfdb file, or one written by another format version or with another page size.
///
/// It travels as `io::Error::new(io::ErrorKind::InvalidData, IncompatibleFile { .. })`
/// and becomes `bfdb::Error::Incompatible` when converted.
#[derive(Debug, Clone)]
pub struct IncompatibleFile {
    /// What was found instead of what this build understands.
    pub reason: String,
}

impl fmt::Display for IncompatibleFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "incompatible file: {}", self.reason)
    }
}

impl std::error::Error for IncompatibleFile {}

/// The detail inside an `io::Error` that reports a store refusing an operation because
/// an earlier write or sync failed.
///
/// After such a failure the store no longer knows which of its writes reached the
/// media, so it refuses to write anything further rather than guess; reopening rebuilds
/// its state from what is durable.
#[derive(Debug, Clone)]
pub struct StorePoisoned {
    /// The failure that poisoned the store, in words.
    pub cause: String,
}

impl fmt::Display for StorePoisoned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "store refuses writes after an earlier write or sync failed ({})",
            self.cause
        )
    }
}

impl std::error::Error for StorePoisoned {}

/// An `io::Error` of kind `InvalidData` carrying [`CorruptPage`] for page `no`.
pub fn corrupt_page(no: PageNo, reason: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        CorruptPage {
            page: no.0,
            reason: reason.into(),
        },
    )
}

/// An `io::Error` of kind `InvalidData` carrying [`IncompatibleFile`].
pub fn incompatible_file(reason: impl Into<String>) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        IncompatibleFile {
            reason: reason.into(),
        },
    )
}

/// An `io::Error` of kind `Other` carrying [`StorePoisoned`].
pub fn store_poisoned(cause: impl Into<String>) -> io::Error {
    io::Error::other(StorePoisoned {
        cause: cause.into(),
    })
}

/// An `io::Error` of kind `InvalidInput` for an operation on a slot that is not
/// allocated.
pub(crate) fn not_allocated(no: PageNo, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("cannot {what} page {no}: it is not an allocated page"),
    )
}

/// Remembers whether a store is poisoned, and why.
///
/// The flag is checked on every write path without a lock; the cause is only read when
/// building the error.
#[derive(Debug, Default)]
pub(crate) struct Poison {
    poisoned: crate::sync::atomic::AtomicBool,
    cause: crate::sync::Mutex<Option<String>>,
}

impl Poison {
    /// Fails if the store is poisoned.
    pub(crate) fn check(&self) -> io::Result<()> {
        use crate::sync::atomic::Ordering;
        if self.poisoned.load(Ordering::Acquire) {
            let cause = self.cause.lock().clone().unwrap_or_default();
            return Err(store_poisoned(cause));
        }
        Ok(())
    }

    /// Poisons the store because of `err` and hands `err` back for returning.
    pub(crate) fn poison(&self, err: io::Error) -> io::Error {
        use crate::sync::atomic::Ordering;
        {
            let mut cause = self.cause.lock();
            if cause.is_none() {
                *cause = Some(err.to_string());
            }
        }
        self.poisoned.store(true, Ordering::Release);
        err
    }

    /// Whether the store is poisoned.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(crate::sync::atomic::Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_then_verify_round_trips_and_keeps_lsn() {
        let mut page = Page::zeroed();
        page.payload_mut()[..3].copy_from_slice(b"abc");
        page.set_lsn(0x0102_0304_0506_0708);
        page.stamp(PageKind::Data);
        assert!(page.verify(PageNo(7), PageKind::Data).is_ok());
        assert_eq!(page.lsn(), 0x0102_0304_0506_0708);
        assert_eq!(&page.payload()[..3], b"abc");
        assert_eq!(&page.as_bytes()[4..8], &[1, 0, 1, 0]);
    }

    #[test]
    fn every_single_byte_flip_is_detected() {
        let mut page = Page::zeroed();
        for (i, b) in page.payload_mut().iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        page.stamp(PageKind::Data);
        for i in 0..PAGE_SIZE {
            let mut bad = page.clone();
            bad.as_bytes_mut()[i] ^= 0x40;
            let err = bad.verify(PageNo(3), PageKind::Data).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "byte {i}");
            let inner = err.get_ref().unwrap();
            let c = inner.downcast_ref::<CorruptPage>().expect("corrupt page");
            assert_eq!(c.page, 3);
        }
    }

    #[test]
    fn other_version_with_valid_crc_is_incompatible() {
        let mut page = Page::zeroed();
        page.stamp(PageKind::Data);
        page.as_bytes_mut()[VERSION_RANGE].copy_from_slice(&2u16.to_le_bytes());
        let crc = page.computed_crc();
        page.as_bytes_mut()[CRC_RANGE].copy_from_slice(&crc.to_le_bytes());
        let err = page.verify(PageNo(1), PageKind::Data).unwrap_err();
        assert!(err.get_ref().unwrap().is::<IncompatibleFile>());
    }

    #[test]
    fn wrong_kind_and_zero_page_are_corrupt() {
        let mut page = Page::zeroed();
        page.stamp(PageKind::FreeList);
        let err = page.verify(PageNo(9), PageKind::Data).unwrap_err();
        assert!(err.to_string().contains("kind"), "{err}");
        let err = Page::zeroed()
            .verify(PageNo(9), PageKind::Data)
            .unwrap_err();
        assert!(err.to_string().contains("all zeros"), "{err}");
    }

    #[test]
    fn boxed_is_zeroed_and_aligned() {
        let page = Page::boxed();
        assert!(page.as_bytes().iter().all(|&b| b == 0));
        assert_eq!((&*page as *const Page as usize) % PAGE_SIZE, 0);
    }
}
