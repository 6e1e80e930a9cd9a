//! Async page reads on a tokio-uring runtime (feature `tokio-uring`):
//! [`AsyncPageReader`]; and the ring read of a block device's segment file that the hash
//! tier's async reads await (`read_on_ring`).
//!
//! For a caller that runs inside a tokio-uring runtime (one thread, one ring, many
//! tasks) and wants a page read to yield the thread instead of blocking it. A store that
//! keeps its pages in a plain file says where a page lives
//! ([`PageStore::raw_page_location`]); the read is then submitted on the runtime's ring
//! and awaited. Any other store is read with the blocking [`PageStore::read_page`].
//!
//! tokio-uring 0.5 is the latest release and is no longer actively maintained. Its use
//! is confined to this module — `read_exact_at` on a `File` made from a duplicate of a
//! descriptor, into a [`Page`] or an [`AlignedBuf`] — so replacing it touches nothing
//! else.
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
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::rc::Rc;

use tokio_uring::buf::{IoBuf, IoBufMut};
use tokio_uring::fs::File;

use super::{AlignedBuf, Page, PageKind, PageNo, PageStore};

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

/// Heap bytes that stay where they are while their owner moves: what the ring may
/// write into while it owns the buffer.
///
/// # Safety
///
/// `bytes` and `bytes_mut` return the same allocation every time, which neither moves
/// nor is freed while the implementor lives, and whose every byte is initialised.
unsafe trait StableBytes: Unpin + 'static {
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
}

// SAFETY: a boxed page's bytes are its heap allocation, zeroed when allocated.
unsafe impl StableBytes for Box<Page> {
    fn bytes(&self) -> &[u8] {
        self.as_bytes()
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.as_bytes_mut()
    }
}

// SAFETY: an `AlignedBuf` owns its allocation (heap or mapping), zeroed when allocated,
// and frees it only when dropped.
unsafe impl StableBytes for AlignedBuf {
    fn bytes(&self) -> &[u8] {
        self.as_ref()
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.as_mut()
    }
}

/// Aligned bytes (a [`Page`] or an [`AlignedBuf`], as `O_DIRECT` reads need) as a
/// tokio-uring buffer.
struct RingBuf<B>(B);

// SAFETY: the bytes are `B`'s stable allocation (see `StableBytes`), which the runtime
// keeps alive by owning the `RingBuf`; every byte is initialised.
unsafe impl<B: StableBytes> IoBuf for RingBuf<B> {
    fn stable_ptr(&self) -> *const u8 {
        self.0.bytes().as_ptr()
    }

    fn bytes_init(&self) -> usize {
        self.0.bytes().len()
    }

    fn bytes_total(&self) -> usize {
        self.0.bytes().len()
    }
}

// SAFETY: as for `IoBuf`; the pointer is to the same stable, writable allocation.
unsafe impl<B: StableBytes> IoBufMut for RingBuf<B> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.0.bytes_mut().as_mut_ptr()
    }

    unsafe fn set_init(&mut self, _pos: usize) {
        // Every byte is initialised from the start.
    }
}

/// A duplicate of descriptor `fd`, for a tokio-uring `File` to own and close (the
/// owner of `fd` keeps its own).
fn duplicate(fd: RawFd) -> io::Result<std::fs::File> {
    // SAFETY: `fcntl` only reads the descriptor number; the caller keeps `fd` open for
    // the duration of the call.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is a fresh descriptor that nothing else owns; the `File` takes
    // ownership and closes it when dropped.
    Ok(unsafe { std::fs::File::from_raw_fd(dup) })
}

/// Reads `len` bytes at `offset` of `file` (a segment file of a
/// [`BlockDevice`](super::BlockDevice), with `offset` and `len` aligned as it reads) on
/// the runtime's ring, through a duplicate of its descriptor: a truncation that deletes
/// the file meanwhile leaves its bytes readable. Must be awaited inside a tokio-uring
/// runtime.
pub(crate) async fn read_on_ring(
    file: &std::fs::File,
    offset: u64,
    len: usize,
) -> io::Result<AlignedBuf> {
    let file = File::from_std(duplicate(file.as_raw_fd())?);
    let (result, buf) = file
        .read_exact_at(RingBuf(AlignedBuf::new(len)), offset)
        .await;
    // Closing a duplicate cannot lose data (nothing was written through it).
    let _ = file.close().await;
    result.map(|()| buf.0)
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
        let (result, buf) = file.read_exact_at(RingBuf(Page::boxed()), offset).await;
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
        // The store keeps `fd` open as long as it lives, and `raw_page_location` just
        // returned it from a live store.
        let file = Rc::new(File::from_std(duplicate(fd)?));
        *cached = Some((fd, Rc::clone(&file)));
        Ok(file)
    }
}
