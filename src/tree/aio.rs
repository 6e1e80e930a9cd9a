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
//! The leaf-page read itself, like every byte of disk IO, goes through the storage layer:
//! [`AsyncPageReader`] submits it on the runtime's ring and verifies the page. Stores
//! without a plain file (memory, the simulator) have no descriptor to submit on; the
//! reader then uses the blocking [`PageStore::read_page`]: correct, but it blocks the
//! runtime's thread for the read.
//!
//! [`PageStore::read_page`]: crate::storage::PageStore::read_page

use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use super::leaf_io::LeafTicket;
use super::leaf_page::LeafPage;
use super::read::Probe;
use super::scan::{Bounds, Buffered, Direction, FetchStep, Sink, is_empty};
use super::stats::bump;
use super::{Core, Tree};
use crate::error::Result;
use crate::storage::{AsyncPageReader, ReadPath};

/// Async attempts at a read whose leaf page keeps changing under it, before the
/// operation takes the blocking locked path instead.
const ASYNC_ATTEMPTS: usize = 4;

/// Async reads of a [`Tree`] for tasks of a tokio-uring runtime.
///
/// Made from an `Arc<Tree>`, which other threads may keep using (writes included) at the
/// same time. Like tokio-uring's own types it is not `Send`: make one per runtime thread.
///
/// In a [`Db`](crate::Db) that holds values kept out of line, a read holds the value
/// store's read guard from its lookup until it has read the value, across its awaits,
/// and a checkpoint's release of freed values waits for such guards: do not block a
/// runtime thread on [`Db::checkpoint`](crate::Db::checkpoint) or
/// [`Db::close`](crate::Db::close) while reads of that thread are pending (the
/// database's background checkpoints run on their own thread).
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
    /// Reads leaf pages on the runtime's ring.
    reader: AsyncPageReader,
}

impl std::fmt::Debug for AsyncTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncTree")
            .field("tree", &self.tree)
            .finish_non_exhaustive()
    }
}

impl AsyncTree {
    /// Async reads of `tree`.
    pub fn new(tree: Arc<Tree>) -> AsyncTree {
        AsyncTree {
            tree,
            reader: AsyncPageReader::new(),
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
    /// (when one is needed) and the read of a value kept out of line awaited on the
    /// runtime's ring.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let core = self.core();
        core.check_key(key)?;
        // Before the lookup, until an out-of-line value it finds is read: its extent is
        // not reused meanwhile (the guard is `Send`, so it may live across the awaits).
        let _guard = core.value_guard();
        let mut promote = None;
        let mut out = Vec::new();
        let mut found = None;
        for _ in 0..ASYNC_ATTEMPTS {
            out.clear();
            let ticket = match core.probe(key, &mut out)? {
                Probe::Done(done) => {
                    found = Some(done);
                    break;
                }
                Probe::Leaf(ticket) => ticket,
            };
            let promote = *promote.get_or_insert_with(|| core.promote_point_read(key));
            let Some(page) = self.read_leaf(&ticket).await? else {
                continue;
            };
            if let Some(done) = core.finish_read(key, &ticket, &page, &mut out, promote)? {
                found = Some(done);
                break;
            }
            bump(&core.counters.stale_leaf_reads);
        }
        let found = match found {
            Some(found) => found,
            None => {
                out.clear();
                core.get(key, &mut out)?
            }
        };
        Ok(core.resolve_on_ring(found, &mut out).await?.then_some(out))
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
            front: Buffered::default(),
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
        out: &mut Buffered,
    ) -> Result<Option<Bound<Vec<u8>>>> {
        // Held from the fetch's lookups until its out-of-line values are read.
        let _guard = self.core().value_guard();
        let next = self.fetch_records(lower, upper, out).await?;
        out.resolve(self.core())?;
        Ok(next)
    }

    /// [`AsyncTree::fetch`] without reading the out-of-line values.
    async fn fetch_records(
        &self,
        lower: &Bound<Vec<u8>>,
        upper: &Bound<Vec<u8>>,
        out: &mut Buffered,
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
    async fn read_leaf(&self, ticket: &LeafTicket) -> Result<Option<LeafPage>> {
        let core = self.core();
        let mut leaf = core.new_leaf_page();
        let wide = matches!(leaf, LeafPage::Wide { .. });
        let mut failed = None;
        for (no, slot) in leaf.requests(ticket.leaf) {
            let read = self.reader.read_page(&*core.store, no).await;
            if let Ok((_, ReadPath::Ring)) = &read {
                bump(&core.counters.async_leaf_reads);
            }
            match read {
                Ok((page, _)) if wide => slot.as_bytes_mut().copy_from_slice(page.as_bytes()),
                Ok((page, _)) => *slot = *page,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        match failed {
            None => {
                leaf.gather();
                bump(&core.counters.leaf_reads);
                Ok(Some(leaf))
            }
            Some(_) if !core.ticket_current(ticket) => Ok(None),
            Some(e) => Err(core.read_error(ticket.leaf, e)),
        }
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
    front: Buffered,
    failed: bool,
}

impl std::fmt::Debug for AsyncRange<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncRange")
            .field("unfetched", &self.unfetched)
            .field("buffered", &self.front.records.len())
            .finish_non_exhaustive()
    }
}

impl AsyncRange<'_> {
    /// The next record of the range, `None` at its end.
    pub async fn next(&mut self) -> Option<Result<(Vec<u8>, Vec<u8>)>> {
        loop {
            if let Some(record) = self.front.records.pop_front() {
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
                    self.front.records.clear();
                    return Some(Err(e));
                }
            }
        }
    }
}
