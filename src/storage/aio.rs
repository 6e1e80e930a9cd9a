//! Async page reads on a tokio-uring runtime (feature `tokio-uring`):
//! [`AsyncPageReader`].
//!
//! For a caller that runs inside a tokio-uring runtime (one thread, one ring, many
//! tasks) and wants a page read to yield the thread instead of blocking it. A store that
//! keeps its pages in a plain file says where a page lives
//! ([`PageStore::raw_page_location`]); the read is then submitted on the runtime's ring
//! and awaited. Any other store is read with the blocking [`PageStore::read_page`].
//!
//! tokio-uring 0.5 is the latest release and is no longer actively maintained. Its use
//! is confined to this module — one `read_exact_at` call on a `File` made from a
//! duplicate of the store's descriptor, and a buffer type for [`Page`] — and to the
//! hash tier's `hash/aio.rs`, which does the same for log records; so replacing it
//! touches nothing else.
//!
//! # Invariants this module owns
//!
//! - A page read on the ring is verified (checksum, format version, kind data) exactly
//!   as [`PageStore::read_page`] verifies it, before the caller sees it.
//! - The store's own descriptor is never closed here: the ring reads through a duplicate,
//!   owned and closed by the reader.
//! - A buffer handed to the ring is a heap page owned by the runtime until the read
//!   completes, so it neither moves nor is freed while the kernel writes it.

use std::cell::RefCell;
use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::rc::Rc;

use tokio_uring::buf::{IoBuf, IoBufMut};
use tokio_uring::fs::File;

use super::{PAGE_SIZE, Page, PageKind, PageNo, PageStore};

/// How an [`AsyncPageReader::read_page`] was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadPath {
    /// Submitted on the runtime's ring and awaited.
    Ring,
    /// Read with the blocking [`PageStore::read_page`], because the store has no plain
    /// file to submit on (or the page is not an allocated data page).
    Blocking,
}

/// Reads pages of a store on the current thread's tokio-uring runtime.
///
/// Keeps a tokio-uring `File` on a duplicate of the store's descriptor, made on first
/// use and closed when the reader drops. Like tokio-uring's own types it is not `Send`:
/// make one per runtime thread.
#[derive(Default)]
pub struct AsyncPageReader {
    /// The store's descriptor, and a tokio-uring `File` on a duplicate of it.
    file: RefCell<Option<(RawFd, Rc<File>)>>,
}

impl std::fmt::Debug for AsyncPageReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fd = self.file.borrow().as_ref().map(|(fd, _)| *fd);
        f.debug_struct("AsyncPageReader")
            .field("store_fd", &fd)
            .finish()
    }
}

/// A page as a tokio-uring buffer: 4096-aligned, as `O_DIRECT` reads need.
struct PageBuf(Box<Page>);

// SAFETY: the bytes live in the Box's heap allocation, which does not move when the
// `PageBuf` moves and stays allocated while the runtime owns the `PageBuf`; all
// `PAGE_SIZE` bytes are initialised (the page is zeroed when allocated).
unsafe impl IoBuf for PageBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.0.as_bytes().as_ptr()
    }

    fn bytes_init(&self) -> usize {
        PAGE_SIZE
    }

    fn bytes_total(&self) -> usize {
        PAGE_SIZE
    }
}

// SAFETY: as for `IoBuf`; the pointer is to the same stable, writable allocation.
unsafe impl IoBufMut for PageBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_bytes_mut().as_mut_ptr()
    }

    unsafe fn set_init(&mut self, _pos: usize) {
        // Every byte is initialised from the start.
    }
}

impl AsyncPageReader {
    /// A reader with no file open yet.
    pub fn new() -> AsyncPageReader {
        AsyncPageReader::default()
    }

    /// Reads data page `no` of `store`, verified as [`PageStore::read_page`] verifies
    /// it: on the runtime's ring when the store keeps the page in a plain file, else with
    /// the blocking read. Must be awaited inside a tokio-uring runtime.
    ///
    /// # Errors
    ///
    /// As [`PageStore::read_page`]: OS errors, and a page failing verification as an
    /// error carrying [`CorruptPage`](super::CorruptPage) or
    /// [`IncompatibleFile`](super::IncompatibleFile).
    pub async fn read_page(
        &self,
        store: &dyn PageStore,
        no: PageNo,
    ) -> io::Result<(Box<Page>, ReadPath)> {
        let Some((fd, offset)) = store.raw_page_location(no) else {
            let mut page = Page::boxed();
            store.read_page(no, &mut page)?;
            return Ok((page, ReadPath::Blocking));
        };
        let file = self.file(fd)?;
        let (result, buf) = file.read_exact_at(PageBuf(Page::boxed()), offset).await;
        let page = buf.0;
        result?;
        page.verify(no, PageKind::Data)?;
        Ok((page, ReadPath::Ring))
    }

    /// The tokio-uring file for the store's descriptor `fd`, made on first use from a
    /// duplicate (tokio-uring closes the descriptor it owns; the store keeps its own).
    fn file(&self, fd: RawFd) -> io::Result<Rc<File>> {
        let mut cached = self.file.borrow_mut();
        if let Some((known, file)) = cached.as_ref()
            && *known == fd
        {
            return Ok(Rc::clone(file));
        }
        // SAFETY: `dup` only reads the descriptor number; the store keeps `fd` open as
        // long as it lives, and `raw_page_location` just returned it from a live store.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dup` is a fresh descriptor that nothing else owns; the `File` takes
        // ownership and closes it when dropped.
        let file = Rc::new(File::from_std(unsafe { std::fs::File::from_raw_fd(dup) }));
        *cached = Some((fd, Rc::clone(&file)));
        Ok(file)
    }
}
