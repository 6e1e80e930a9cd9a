//! Async reads on a tokio-uring runtime (feature `tokio-uring`): [`AsyncTree`].
//!
//! For applications that already run a tokio-uring runtime (one thread, one ring, many
//! tasks). A read answers from mini-pages synchronously, exactly as [`Tree::get`] does;
//! when it needs a leaf page, the read is submitted on the runtime's ring and awaited, so
//! the thread runs other tasks meanwhile. Everything else — mini-page hits, promotion,
//! writes, eviction — stays synchronous.
//!
//! No page lock is held across an `.await`. The leaf page is read without the lock and
//! validated afterwards with the page's leaf-write counter, the protocol of
//! [`Tree::get_many`]: the counter is noted under the page's read lock before the read
//! and checked under it again after; an unchanged counter proves no leaf write happened
//! in between, so the page read is neither torn nor stale. A stale read is repeated, and
//! after a few stale attempts the operation falls back to the blocking locked path, so it
//! always finishes.
//!
//! tokio-uring 0.5 is the latest release and is no longer actively maintained. Its use is
//! confined to this module — one `read_exact_at` call on a `File` made from a duplicate of
//! the page store's descriptor, and a buffer type for [`Page`] — so replacing it touches
//! nothing else.
//!
//! Stores without a plain file (memory, the simulator) have no descriptor to submit on;
//! the async API then reads with the blocking [`PageStore::read_page`]: correct, but it
//! blocks the runtime's thread for the read.
//!
//! [`PageStore::read_page`]: crate::storage::PageStore::read_page

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ops::{Bound, RangeBounds};
use std::os::fd::{FromRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;

use tokio_uring::buf::{IoBuf, IoBufMut};
use tokio_uring::fs::File;

use super::leaf_io::LeafTicket;
use super::read::Probe;
use super::scan::{Bounds, Direction, FetchStep, is_empty};
use super::stats::bump;
use super::{Core, Tree};
use crate::error::{Error, Result};
use crate::storage::{PAGE_SIZE, Page, PageKind};

/// Async attempts at a read whose leaf page keeps changing under it, before the
/// operation takes the blocking locked path instead.
const ASYNC_ATTEMPTS: usize = 4;

/// Async reads of a [`Tree`] for tasks of a tokio-uring runtime.
///
/// Made from an `Arc<Tree>`, which other threads may keep using (writes included) at the
/// same time. Like tokio-uring's own types it is not `Send`: make one per runtime thread.
///
/// ```no_run
/// use std::sync::Arc;
///
/// let tree = Arc::new(bfdb::Tree::open("/tmp/bfdb-aio-doc", bfdb::Config::default())?);
/// tree.insert(b"apple", b"red")?;
/// tokio_uring::start(async {
///     let reader = bfdb::aio::AsyncTree::new(Arc::clone(&tree));
///     assert_eq!(reader.get(b"apple").await?.as_deref(), Some(&b"red"[..]));
///     let all = reader.scan(&b"a"[..].., 10).await?;
///     assert_eq!(all.len(), 1);
///     Ok::<(), bfdb::Error>(())
/// })?;
/// # Ok::<(), bfdb::Error>(())
/// ```
pub struct AsyncTree {
    tree: Arc<Tree>,
    /// The page store's descriptor, and a tokio-uring `File` on a duplicate of it (made
    /// on first use, closed when this drops).
    file: RefCell<Option<(RawFd, Rc<File>)>>,
}

impl std::fmt::Debug for AsyncTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncTree")
            .field("tree", &self.tree)
            .finish_non_exhaustive()
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

impl AsyncTree {
    /// Async reads of `tree`.
    pub fn new(tree: Arc<Tree>) -> AsyncTree {
        AsyncTree {
            tree,
            file: RefCell::new(None),
        }
    }

    /// The tree read by this handle, for its synchronous API (writes, stats).
    pub fn tree(&self) -> &Arc<Tree> {
        &self.tree
    }

    fn core(&self) -> &Core {
        &self.tree.core
    }

    /// The value stored under `key`, if any; as [`Tree::get`], with the leaf-page read
    /// (when one is needed) awaited on the runtime's ring.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let core = self.core();
        core.check_key(key)?;
        let mut promote = None;
        let mut out = Vec::new();
        for _ in 0..ASYNC_ATTEMPTS {
            out.clear();
            let ticket = match core.probe(key, &mut out)? {
                Probe::Done(exists) => return Ok(exists.then_some(out)),
                Probe::Leaf(ticket) => ticket,
            };
            let promote = *promote.get_or_insert_with(|| core.promote_point_read(key));
            let Some(page) = self.read_leaf(&ticket).await? else {
                continue;
            };
            if let Some(exists) = core.finish_read(key, &ticket, &page, &mut out, promote)? {
                return Ok(exists.then_some(out));
            }
            bump(&core.counters.stale_leaf_reads);
        }
        out.clear();
        Ok(core.get(key, &mut out)?.then_some(out))
    }

    /// An async cursor over the records whose keys lie in `range`, in key order (forward
    /// only). Holds no lock between calls to [`AsyncRange::next`]; under concurrent writes
    /// it yields strictly increasing keys, each with a value that was current at some
    /// moment during the scan, as [`Tree::range`] does.
    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> AsyncRange<'_> {
        let own = |b: Bound<&K>| match b {
            Bound::Included(k) => Bound::Included(k.as_ref().to_vec()),
            Bound::Excluded(k) => Bound::Excluded(k.as_ref().to_vec()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let (lower, upper) = (own(range.start_bound()), own(range.end_bound()));
        AsyncRange {
            tree: self,
            unfetched: (!is_empty(&lower, &upper)).then_some((lower, upper)),
            front: VecDeque::new(),
            failed: false,
        }
    }

    /// Up to `limit` records of `range`, in key order: [`AsyncTree::range`] collected.
    pub async fn scan<K: AsRef<[u8]>, R: RangeBounds<K>>(
        &self,
        range: R,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut cursor = self.range(range);
        let mut records = Vec::new();
        while records.len() < limit {
            match cursor.next().await {
                Some(record) => records.push(record?),
                None => break,
            }
        }
        Ok(records)
    }

    /// Fetches the page holding `lower` into `out`; as `Core::fetch` going forward, with
    /// the leaf-page read awaited.
    async fn fetch(
        &self,
        lower: &Bound<Vec<u8>>,
        upper: &Bound<Vec<u8>>,
        out: &mut VecDeque<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Option<Bound<Vec<u8>>>> {
        let core = self.core();
        let promote = core.promote_scan();
        for _ in 0..ASYNC_ATTEMPTS {
            let ticket = match core.fetch_or_ticket(lower, upper, out)? {
                FetchStep::Fetched(next) => return Ok(next),
                FetchStep::Leaf(ticket) => ticket,
            };
            let Some(page) = self.read_leaf(&ticket).await? else {
                continue;
            };
            if let Some(next) =
                core.fetch_with_leaf(&ticket, &page, (lower, upper), out, promote)?
            {
                return Ok(next);
            }
            bump(&core.counters.stale_leaf_reads);
        }
        core.fetch(
            lower,
            upper,
            (Direction::Forward, usize::MAX),
            out,
            (&mut Vec::new(), 0),
        )
    }

    /// Reads the ticket's leaf page without its lock, on the runtime's ring when the
    /// store has a file. `Ok(None)`: the read failed, but the page changed meanwhile (a
    /// torn read of a page being rewritten fails its checksum), so it is no error: start
    /// again.
    async fn read_leaf(&self, ticket: &LeafTicket) -> Result<Option<Box<Page>>> {
        let core = self.core();
        let no = ticket.leaf;
        let read = match core.store.raw_page_location(no) {
            Some((fd, offset)) => {
                let file = self.file(fd)?;
                let (result, buf) = file.read_exact_at(PageBuf(Page::boxed()), offset).await;
                let page = buf.0;
                result
                    .and_then(|()| page.verify(no, PageKind::Data))
                    .map(|()| {
                        bump(&core.counters.async_leaf_reads);
                        page
                    })
            }
            None => {
                let mut page = Page::boxed();
                core.store.read_page(no, &mut page).map(|()| page)
            }
        };
        match read {
            Ok(page) => {
                bump(&core.counters.leaf_reads);
                Ok(Some(page))
            }
            Err(_) if !core.ticket_current(ticket) => Ok(None),
            Err(e) => Err(Error::from(e)),
        }
    }

    /// The tokio-uring file for the store's descriptor `fd`, made on first use from a
    /// duplicate (tokio-uring closes the descriptor it owns; the store keeps its own).
    fn file(&self, fd: RawFd) -> Result<Rc<File>> {
        let mut cached = self.file.borrow_mut();
        if let Some((known, file)) = cached.as_ref()
            && *known == fd
        {
            return Ok(Rc::clone(file));
        }
        // SAFETY: `dup` only reads the descriptor number; the store keeps `fd` open for
        // its lifetime, which the `Arc<Tree>` we hold outlives this call.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(Error::from(std::io::Error::last_os_error()));
        }
        // SAFETY: `dup` is a fresh descriptor that nothing else owns; the `File` takes
        // ownership and closes it when dropped.
        let file = Rc::new(File::from_std(unsafe { std::fs::File::from_raw_fd(dup) }));
        *cached = Some((fd, Rc::clone(&file)));
        Ok(file)
    }
}

/// An async cursor over a key range, from [`AsyncTree::range`].
///
/// Yields `Result<(key, value)>` from [`AsyncRange::next`]; after an `Err` it ends.
pub struct AsyncRange<'a> {
    tree: &'a AsyncTree,
    /// The keys not fetched yet; `None` once everything was fetched.
    unfetched: Option<Bounds>,
    /// Fetched records, ascending; all below the unfetched range.
    front: VecDeque<(Vec<u8>, Vec<u8>)>,
    failed: bool,
}

impl std::fmt::Debug for AsyncRange<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncRange")
            .field("unfetched", &self.unfetched)
            .field("buffered", &self.front.len())
            .finish_non_exhaustive()
    }
}

impl AsyncRange<'_> {
    /// The next record of the range, `None` at its end.
    pub async fn next(&mut self) -> Option<Result<(Vec<u8>, Vec<u8>)>> {
        loop {
            if let Some(record) = self.front.pop_front() {
                return Some(Ok(record));
            }
            if self.failed {
                return None;
            }
            let (lower, upper) = self.unfetched.take()?;
            match self.tree.fetch(&lower, &upper, &mut self.front).await {
                Ok(Some(next)) if !is_empty(&next, &upper) => {
                    self.unfetched = Some((next, upper));
                }
                Ok(_) => {}
                Err(e) => {
                    self.failed = true;
                    self.front.clear();
                    return Some(Err(e));
                }
            }
        }
    }
}
