//! Range scans (Bf-Tree §5.3) without holding locks between calls.
//!
//! The iterator keeps the part of the key range it has not fetched yet, `[lower, upper)`
//! in bound form, and a buffer of records fetched from each end. A fetch re-enters the
//! tree from the root for the page holding `lower` (or the keys just below `upper`),
//! takes that page's read lock, merges its mini-page and leaf-page records in key order,
//! copies out the ones in range, narrows the unfetched range past the page's fence, and
//! unlocks. Records in the front buffer lie below every unfetched key and records in the
//! back buffer above, so the two ends never yield a key twice, keys come out strictly
//! ordered even while writers split pages, and nothing recurses per record.

use std::collections::VecDeque;
use std::ops::Bound;

use crossbeam_epoch as epoch;

use crate::sync::atomic::Ordering;

use super::descend::{LeafPath, Target};
use super::leaf::{MINI_HEADER_BYTES, MiniHeader};
use super::leaf_io::LeafTicket;
use super::leaf_page::LeafPage;
use super::mapping::{self, Location, MappingTable, PageId};
use super::mini::PageLock;
use super::node::{self, Fences, NodeKind, NodeRef, RecordType, RecordView};
use super::plan::owned_fence;
use super::stats::{bump, bump_by};
use super::{Core, inner};
use crate::error::{Error, Result};
use crate::storage::PageNo;

type Record = (Vec<u8>, Vec<u8>);

/// Leaf pages a fetch reads ahead of need by default: the pages after the fetched one
/// (before it, going backward), read in the same batch as the fetched page.
const PREFETCH_PAGES: usize = 8;

/// The most pages [`Range::read_ahead`] accepts.
pub const MAX_READ_AHEAD_PAGES: usize = 64;

/// Records the first fetch of a scan copies out of a mirror; each later fetch doubles
/// it (up to `MAX_FETCH_RECORDS`). Short scans — the common kind — then copy a few
/// dozen records, not a whole page, while long ones soon move a page per fetch.
const FIRST_FETCH_RECORDS: usize = 32;
const MAX_FETCH_RECORDS: usize = 4096;

/// A leaf page read ahead of need, with the ticket that validates it when its turn
/// comes (the page was read while the scan held only another page's lock).
pub(super) struct Prefetched {
    ticket: LeafTicket,
    page: LeafPage,
}

/// A page's low and high fence keys (`None`: the edge of the key space).
type OwnedFences = (Option<Vec<u8>>, Option<Vec<u8>>);

/// How a fetch gets a page's leaf page without holding the page's lock.
enum LeafRead {
    /// Read ahead by an earlier fetch, and valid when planned.
    Prefetched(Prefetched),
    /// To be read now, together with the pages read ahead for the next fetches.
    Read {
        ticket: LeafTicket,
        ahead: Vec<LeafTicket>,
    },
}
/// The unfetched part of a range: lower and upper bound.
pub(super) type Bounds = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// What a scan keeps between fetches, the same for [`Range`] and [`Cursor`]: the keys
/// not fetched yet, the leaf pages read ahead, and how much the next fetch copies and
/// reads ahead.
struct FetchState<'t> {
    core: &'t Core,
    /// The keys not fetched yet; `None` once everything was fetched.
    unfetched: Option<Bounds>,
    /// Leaf pages read ahead for the next fetches.
    prefetched: Vec<Prefetched>,
    /// The most pages a fetch reads ahead (0: none).
    read_ahead_pages: usize,
    /// Fetches so far: read-ahead grows with them (0, 0, 1, 3, 7, ...
    /// pages), so a short scan that ends in its first page reads no page it does not
    /// need, and a long one soon keeps `read_ahead_pages` reads in flight.
    fetches: u32,
    /// The most records the next fetch copies out of a mirror.
    fetch_records: usize,
    /// Set by a failed fetch: the scan has ended.
    failed: bool,
}

impl<'t> FetchState<'t> {
    fn new(core: &'t Core, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>) -> Self {
        let unfetched = (!is_empty(&lower, &upper)).then_some((lower, upper));
        FetchState {
            core,
            unfetched,
            prefetched: Vec::new(),
            read_ahead_pages: PREFETCH_PAGES,
            fetches: 0,
            fetch_records: FIRST_FETCH_RECORDS,
            failed: false,
        }
    }

    /// The setting behind [`Range::read_ahead`] and [`Cursor::read_ahead`].
    fn read_ahead(&mut self, pages: usize) {
        self.read_ahead_pages = pages.min(MAX_READ_AHEAD_PAGES);
    }

    /// Pages the next fetch may read ahead (0, 0, 1, 3, 7, ... up to `read_ahead_pages`);
    /// counts the fetch. The second fetch reads no page ahead either: a short scan that
    /// started near the end of its page needs only the next page, and reading one more
    /// for it was a fifth of all the pages short scans read (a 32-record scan read 1.64
    /// pages where 1.36 were needed).
    fn ahead_pages(&mut self) -> usize {
        let grown = (1usize << self.fetches.saturating_sub(1).min(16)) - 1;
        self.fetches += 1;
        grown.min(self.read_ahead_pages)
    }

    /// Fetches the next page's records of the unfetched range from the end `direction`
    /// names into `out` (as `Core::fetch` puts them) and narrows the unfetched range past
    /// them. `None`: nothing is left to fetch, or an earlier fetch failed. After
    /// `Some(Err(_))` the scan has failed: the pages read ahead are dropped and later
    /// calls return `None`.
    fn fetch(&mut self, direction: Direction, out: &mut impl Sink) -> Option<Result<()>> {
        if self.failed {
            return None;
        }
        let (lower, upper) = self.unfetched.take()?;
        let limit = self.fetch_records;
        self.fetch_records = (limit * 2).min(MAX_FETCH_RECORDS);
        out.reserve(limit);
        let ahead = self.ahead_pages();
        // Held from the fetch's lookups until its out-of-line values are read.
        let _guard = self.core.value_guard();
        let fetched = self
            .core
            .fetch(
                &lower,
                &upper,
                (direction, limit),
                out,
                (&mut self.prefetched, ahead),
            )
            .and_then(|next| out.resolve(self.core).map(|()| next));
        match fetched {
            Ok(Some(next)) => {
                // Each fetch moves its end of the unfetched range strictly inwards
                // (a page's fence lies past every key the page routes); one that does
                // not met a page whose fences are not its range, and would loop.
                let stalled = match direction {
                    Direction::Forward => !moves_up(&lower, &next),
                    Direction::Backward => !moves_down(&upper, &next),
                };
                if stalled {
                    let e = self.core.stalled_scan(&lower, &upper, direction);
                    self.failed = true;
                    self.prefetched.clear();
                    return Some(Err(e));
                }
                let rest = match direction {
                    Direction::Forward => (next, upper),
                    Direction::Backward => (lower, next),
                };
                if !is_empty(&rest.0, &rest.1) {
                    self.unfetched = Some(rest);
                }
                Some(Ok(()))
            }
            Ok(None) => Some(Ok(())),
            Err(e) => {
                self.failed = true;
                self.prefetched.clear();
                Some(Err(e))
            }
        }
    }
}

/// An iterator over a key range of a [`Tree`](crate::Tree), from
/// [`Tree::range`](crate::Tree::range) or [`Tree::prefix`](crate::Tree::prefix).
///
/// Yields `Result<(key, value)>`; after an `Err` it ends. Works from both ends
/// (`DoubleEndedIterator`).
pub struct Range<'t> {
    state: FetchState<'t>,
    /// Fetched by `next`, ascending; all below the unfetched range.
    front: Buffered,
    /// Fetched by `next_back`, descending; all above the unfetched range.
    back: Buffered,
}

impl std::fmt::Debug for Range<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Range")
            .field("unfetched", &self.state.unfetched)
            .field("front_buffered", &self.front.records.len())
            .field("back_buffered", &self.back.records.len())
            .field("prefetched_pages", &self.state.prefetched.len())
            .finish_non_exhaustive()
    }
}

impl<'t> Range<'t> {
    pub(super) fn new(core: &'t Core, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>) -> Self {
        Range {
            state: FetchState::new(core, lower, upper),
            front: Buffered::default(),
            back: Buffered::default(),
        }
    }

    /// Sets how many leaf pages a fetch reads ahead at most, in the same batched read as
    /// the page it needs (default 8, at most [`MAX_READ_AHEAD_PAGES`]; 0 turns read-ahead
    /// off). The first fetch reads none ahead, and each later one up to twice as many
    /// plus one, so short scans read only the pages they use. Only pages holding keys of the range, under the same inner node, and not
    /// cached whole in the pool are read ahead.
    pub fn read_ahead(mut self, pages: usize) -> Self {
        self.state.read_ahead(pages);
        self
    }

    /// The next record from the end `direction` names: `next` and `next_back` are one
    /// walk with the two buffers' roles swapped.
    fn next_from(&mut self, direction: Direction) -> Option<Result<Record>> {
        // `near` holds what this end fetched, nearest first; `far` what the other end
        // fetched, which this end reaches once nothing is left unfetched.
        let (near, far) = match direction {
            Direction::Forward => (&mut self.front, &mut self.back),
            Direction::Backward => (&mut self.back, &mut self.front),
        };
        loop {
            if let Some(r) = near.records.pop_front() {
                return Some(Ok(r));
            }
            match self.state.fetch(direction, near) {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    // The scan ends at its first error, at both ends.
                    near.records.clear();
                    far.records.clear();
                    return Some(Err(e));
                }
                None => return far.records.pop_back().map(Ok),
            }
        }
    }
}

impl Iterator for Range<'_> {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_from(Direction::Forward)
    }
}

impl DoubleEndedIterator for Range<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.next_from(Direction::Backward)
    }
}

impl std::iter::FusedIterator for Range<'_> {}

/// A forward scan that lends each record instead of allocating it, from
/// [`Tree::cursor`](crate::Tree::cursor).
///
/// [`Range`] yields owned `(Vec<u8>, Vec<u8>)` pairs, two allocations per record; a
/// cursor copies each fetch's records into one byte buffer it reuses, and
/// [`Cursor::next`] returns slices of it, valid until the next call. Same guarantees as
/// [`Range`]: keys strictly increasing, no lock held between calls, after an `Err` it
/// ends.
///
/// ```
/// let tree = bfdb::Tree::in_memory(bfdb::Config::default())?;
/// for i in 0..100u8 {
///     tree.insert(&[b'k', i], &[i])?;
/// }
/// let mut cursor = tree.cursor(&[b'k', 10][..]..);
/// let mut sum = 0u32;
/// for _ in 0..5 {
///     let (key, value) = cursor.next().expect("a record")?;
///     assert_eq!(key[1], value[0]);
///     sum += u32::from(value[0]);
/// }
/// assert_eq!(sum, 10 + 11 + 12 + 13 + 14);
/// # Ok::<(), bfdb::Error>(())
/// ```
pub struct Cursor<'t> {
    state: FetchState<'t>,
    /// The records of the last fetch.
    buffer: Lent,
}

/// Records stored back to back in one buffer (two allocations for any number of
/// records): `spans[i]` says where record `i`'s key and value lie.
#[derive(Default)]
struct Flat {
    bytes: Vec<u8>,
    spans: Vec<Span>,
}

/// Where one record of a [`Flat`] lies. The value follows the key, except for a value
/// read from the value store in place of its reference (`Flat::resolve`).
#[derive(Clone, Copy)]
struct Span {
    key_at: usize,
    key_len: usize,
    value_at: usize,
    value_len: usize,
    /// The value bytes are a reference to a value kept out of line, not resolved yet.
    external: bool,
}

impl Flat {
    fn with_capacity(records: usize, bytes: usize) -> Flat {
        Flat {
            bytes: Vec::with_capacity(bytes),
            spans: Vec::with_capacity(records),
        }
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.spans.clear();
    }

    /// Makes room for `records` more records of `bytes` in all, so that filling the
    /// buffer does not grow it step by step.
    fn reserve(&mut self, records: usize, bytes: usize) {
        self.spans.reserve(records);
        self.bytes.reserve(bytes);
    }

    fn len(&self) -> usize {
        self.spans.len()
    }

    /// Record `i` as (key, value).
    fn get(&self, i: usize) -> (&[u8], &[u8]) {
        let s = self.spans[i];
        (
            &self.bytes[s.key_at..s.key_at + s.key_len],
            &self.bytes[s.value_at..s.value_at + s.value_len],
        )
    }

    /// The records in order, as (key, value, whether the value is a reference to a
    /// value kept out of line).
    fn iter(&self) -> impl DoubleEndedIterator<Item = (&[u8], &[u8], bool)> + '_ {
        (0..self.len()).map(|i| {
            let (key, value) = self.get(i);
            (key, value, self.spans[i].external)
        })
    }

    /// Appends a record whose key is `prefix ‖ suffix`.
    fn push(&mut self, (prefix, suffix): (&[u8], &[u8]), value: &[u8], external: bool) {
        let key_at = self.bytes.len();
        self.bytes.extend_from_slice(prefix);
        self.bytes.extend_from_slice(suffix);
        let value_at = self.bytes.len();
        self.bytes.extend_from_slice(value);
        self.spans.push(Span {
            key_at,
            key_len: value_at - key_at,
            value_at,
            value_len: value.len(),
            external,
        });
    }

    fn push_view(&mut self, r: &RecordView<'_>) {
        let external = r.record_type().is_external();
        self.push((r.prefix(), r.suffix()), r.value(), external);
    }

    /// Reads the out-of-line values of records `from..` in place of their references
    /// (appended to the buffer; the references stay behind, unused).
    fn resolve(&mut self, core: &Core, from: usize) -> Result<()> {
        let mut value = Vec::new();
        for i in from..self.len() {
            let s = self.spans[i];
            if !s.external {
                continue;
            }
            value.clear();
            let reference = self.bytes[s.value_at..s.value_at + s.value_len].to_vec();
            core.host()?.read(&reference, &mut value)?;
            self.spans[i] = Span {
                value_at: self.bytes.len(),
                value_len: value.len(),
                external: false,
                ..s
            };
            self.bytes.extend_from_slice(&value);
        }
        Ok(())
    }
}

/// The records of the cursor's last fetch; `next` is the first not yet lent.
#[derive(Default)]
struct Lent {
    records: Flat,
    next: usize,
}

impl Lent {
    fn clear(&mut self) {
        self.records.clear();
        self.next = 0;
    }
}

impl Sink for Lent {
    fn push_view(&mut self, r: &RecordView<'_>) {
        self.records.push_view(r);
    }
    fn push_parts(&mut self, key: &[u8], value: &[u8], external: bool) {
        self.records.push((key, &[]), value, external);
    }
    fn resolve(&mut self, core: &Core) -> Result<()> {
        // A fetch fills the buffer after it was emptied: every record is this fetch's.
        self.records.resolve(core, 0)
    }
    fn reserve(&mut self, records: usize) {
        // A guess at the records' size (keys and values of 16 to 32 bytes); a fetch
        // from a page that is not a mirror may bring more, and the buffer then grows.
        self.records.reserve(records, records * 64);
    }
}

impl std::fmt::Debug for Cursor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cursor")
            .field("unfetched", &self.state.unfetched)
            .field("buffered", &(self.buffer.records.len() - self.buffer.next))
            .finish_non_exhaustive()
    }
}

impl<'t> Cursor<'t> {
    pub(super) fn new(core: &'t Core, lower: Bound<Vec<u8>>, upper: Bound<Vec<u8>>) -> Self {
        Cursor {
            state: FetchState::new(core, lower, upper),
            buffer: Lent::default(),
        }
    }

    /// As [`Range::read_ahead`].
    pub fn read_ahead(mut self, pages: usize) -> Self {
        self.state.read_ahead(pages);
        self
    }

    /// The next record as `(key, value)` slices, valid until the next call; `None` at
    /// the end of the range.
    #[allow(
        clippy::should_implement_trait,
        reason = "a lending iterator, not Iterator"
    )]
    pub fn next(&mut self) -> Option<Result<(&[u8], &[u8])>> {
        while self.buffer.next == self.buffer.records.len() {
            // Every record of the last fetch has been lent: the buffer takes the next.
            self.buffer.clear();
            if let Err(e) = self.state.fetch(Direction::Forward, &mut self.buffer)? {
                return Some(Err(e));
            }
        }
        self.buffer.next += 1;
        Some(Ok(self.buffer.records.get(self.buffer.next - 1)))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    Forward,
    Backward,
}

/// Whether no key satisfies both bounds.
pub(super) fn is_empty(lower: &Bound<Vec<u8>>, upper: &Bound<Vec<u8>>) -> bool {
    match (lower, upper) {
        (Bound::Unbounded, _) | (_, Bound::Unbounded) => false,
        (Bound::Included(l), Bound::Included(u)) => l > u,
        (Bound::Included(l), Bound::Excluded(u))
        | (Bound::Excluded(l), Bound::Included(u))
        | (Bound::Excluded(l), Bound::Excluded(u)) => l >= u,
    }
}

fn above(lower: &Bound<Vec<u8>>, key: &[u8]) -> bool {
    match lower {
        Bound::Included(l) => key >= l.as_slice(),
        Bound::Excluded(l) => key > l.as_slice(),
        Bound::Unbounded => true,
    }
}

/// Whether some key above `lower` lies below `key`, roughly: `lower < key`.
fn above_strictly(lower: &Bound<Vec<u8>>, key: &[u8]) -> bool {
    match lower {
        Bound::Included(l) | Bound::Excluded(l) => l.as_slice() < key,
        Bound::Unbounded => true,
    }
}

/// Whether `next`, a new lower bound, admits fewer keys than `lower`: a forward fetch's
/// progress.
fn moves_up(lower: &Bound<Vec<u8>>, next: &Bound<Vec<u8>>) -> bool {
    match (lower, next) {
        (_, Bound::Unbounded) => false,
        (Bound::Unbounded, _) => true,
        (Bound::Included(l), Bound::Included(n)) => n > l,
        (Bound::Included(l), Bound::Excluded(n)) => n >= l,
        (Bound::Excluded(l), Bound::Included(n) | Bound::Excluded(n)) => n > l,
    }
}

/// Whether `next`, a new upper bound, admits fewer keys than `upper`: a backward
/// fetch's progress.
fn moves_down(upper: &Bound<Vec<u8>>, next: &Bound<Vec<u8>>) -> bool {
    match (upper, next) {
        (_, Bound::Unbounded) => false,
        (Bound::Unbounded, _) => true,
        (Bound::Included(u), Bound::Included(n)) => n < u,
        (Bound::Included(u), Bound::Excluded(n)) => n <= u,
        (Bound::Excluded(u), Bound::Included(n) | Bound::Excluded(n)) => n < u,
    }
}

fn below(upper: &Bound<Vec<u8>>, key: &[u8]) -> bool {
    match upper {
        Bound::Included(u) => key <= u.as_slice(),
        Bound::Excluded(u) => key < u.as_slice(),
        Bound::Unbounded => true,
    }
}

/// Where a fetch puts the records it copies out: owned pairs for [`Range`], one
/// reused byte buffer for [`Cursor`].
pub(super) trait Sink {
    /// Appends a record viewed in a node the caller holds locked.
    fn push_view(&mut self, r: &RecordView<'_>);
    /// Appends a record copied from a page view; `external`: `value` is a reference to
    /// a value kept out of line.
    fn push_parts(&mut self, key: &[u8], value: &[u8], external: bool);
    /// Makes room for about `records` more records before a fetch; only a hint, which
    /// a sink that grows cheaply ignores.
    fn reserve(&mut self, _records: usize) {}
    /// After a fetch, with no page lock held: reads the out-of-line values of the
    /// records it appended in place of their references.
    fn resolve(&mut self, core: &Core) -> Result<()>;
}

/// The owned records a [`Range`] (or an async range) buffers at one end, with the
/// positions of those whose values are still references to out-of-line values.
#[derive(Default)]
pub(crate) struct Buffered {
    pub(crate) records: VecDeque<Record>,
    /// Indices into `records` of values to read (`Sink::resolve`); records are only
    /// appended between a fetch and its resolution, so the indices hold.
    external: Vec<usize>,
}

impl Sink for Buffered {
    fn push_view(&mut self, r: &RecordView<'_>) {
        self.push_parts(&r.key(), r.value(), r.record_type().is_external());
    }
    fn push_parts(&mut self, key: &[u8], value: &[u8], external: bool) {
        if external {
            self.external.push(self.records.len());
        }
        self.records.push_back((key.to_vec(), value.to_vec()));
    }
    fn resolve(&mut self, core: &Core) -> Result<()> {
        for i in std::mem::take(&mut self.external) {
            let reference = std::mem::take(&mut self.records[i].1);
            core.host()?.read(&reference, &mut self.records[i].1)?;
        }
        Ok(())
    }
}

/// The page a fetch in `direction` of `[lower, upper)` reads next.
fn target<'k>(
    direction: Direction,
    lower: &'k Bound<Vec<u8>>,
    upper: &'k Bound<Vec<u8>>,
) -> Target<'k> {
    match (direction, lower, upper) {
        (Direction::Forward, Bound::Included(k) | Bound::Excluded(k), _) => Target::Holding(k),
        (Direction::Forward, Bound::Unbounded, _) => Target::Holding(&[]),
        (Direction::Backward, _, Bound::Included(k)) => Target::Holding(k),
        (Direction::Backward, _, Bound::Excluded(k)) => Target::Below(k),
        (Direction::Backward, _, Bound::Unbounded) => Target::Last,
    }
}

/// Moves the records of `view` in `[lower, upper)` to the back of `out`, ascending, and
/// returns the new lower bound of the unfetched range (`None` after the last page).
fn take_forward(
    view: PageView,
    lower: &Bound<Vec<u8>>,
    upper: &Bound<Vec<u8>>,
    out: &mut impl Sink,
) -> Option<Bound<Vec<u8>>> {
    for (key, value, external) in view.records.iter() {
        if above(lower, key) && below(upper, key) {
            out.push_parts(key, value, external);
        }
    }
    view.high.map(Bound::Included)
}

/// [`below`] for a record in a node, without assembling its key.
fn view_below(upper: &Bound<Vec<u8>>, r: &RecordView<'_>) -> bool {
    match upper {
        Bound::Included(u) => r.cmp_key(u).is_le(),
        Bound::Excluded(u) => r.cmp_key(u).is_lt(),
        Bound::Unbounded => true,
    }
}

/// [`above`] for a record in a node, without assembling its key.
fn view_above(lower: &Bound<Vec<u8>>, r: &RecordView<'_>) -> bool {
    match lower {
        Bound::Included(l) => r.cmp_key(l).is_ge(),
        Bound::Excluded(l) => r.cmp_key(l).is_gt(),
        Bound::Unbounded => true,
    }
}

/// Copies up to `limit` live records of the mirror `mini` in `[lower, upper)` to `out`
/// (ascending at its back going forward, descending going backward), starting at the
/// end the direction names. Returns the bound that replaces `lower` (forward) or
/// `upper` (backward): just past the last record copied if the limit stopped it, else
/// the mirror's fence, or `None` at the edge of the key space.
fn take_from_mirror(
    mini: &NodeRef<'_>,
    lower: &Bound<Vec<u8>>,
    upper: &Bound<Vec<u8>>,
    (direction, limit): (Direction, usize),
    out: &mut impl Sink,
) -> Option<Bound<Vec<u8>>> {
    // The two directions stay written out apart: folded into one loop, each of its four
    // steps (where to start, which way to walk, which bound stops it, which fence ends
    // it) would branch on the direction.
    let mut taken = 0;
    match direction {
        Direction::Forward => {
            // The first record above `lower`.
            let start = match lower {
                Bound::Unbounded => 0,
                Bound::Included(k) => mini.search(k).unwrap_or_else(|i| i),
                Bound::Excluded(k) => mini.search(k).map_or_else(|i| i, |i| i + 1),
            };
            for i in start..mini.len() {
                let r = mini.record(i);
                if !r.record_type().exists() {
                    continue;
                }
                if !view_below(upper, &r) {
                    return None;
                }
                if taken == limit {
                    return Some(Bound::Included(r.key()));
                }
                out.push_view(&r);
                taken += 1;
            }
            owned_fence(mini.high_fence()).map(Bound::Included)
        }
        Direction::Backward => {
            // One past the last record below `upper`.
            let end = match upper {
                Bound::Unbounded => mini.len(),
                Bound::Included(k) => mini.search(k).map_or_else(|i| i, |i| i + 1),
                Bound::Excluded(k) => mini.search(k).unwrap_or_else(|i| i),
            };
            for i in (0..end).rev() {
                let r = mini.record(i);
                if !r.record_type().exists() {
                    continue;
                }
                if !view_above(lower, &r) {
                    return None;
                }
                if taken == limit {
                    return Some(Bound::Included(r.key()));
                }
                out.push_view(&r);
                taken += 1;
            }
            owned_fence(mini.low_fence()).map(Bound::Excluded)
        }
    }
}

/// The outcome of `Core::fetch_or_ticket`.
#[cfg(feature = "tokio-uring")]
pub(crate) enum FetchStep {
    /// The page was fetched without IO; the new lower bound, as `fetch` returns it.
    Fetched(Option<Bound<Vec<u8>>>),
    /// Its leaf page must be read first.
    Leaf(LeafTicket),
}

/// A page's records merged from its mini-page (newer) and leaf page, and its fences.
struct PageView {
    records: Flat,
    low: Option<Vec<u8>>,
    high: Option<Vec<u8>>,
}

impl Core {
    /// Fetches one page's records of `[lower, upper)` into `out` (ascending at the back
    /// of `out` going forward, descending going backward) and returns the bound that
    /// replaces `lower` (forward) or `upper` (backward), or `None` when the page was the
    /// last one in that direction.
    ///
    /// From a mirror, a fetch copies at most `limit` records (the bound it returns then
    /// lies just past the last one); from other pages it takes the whole page's part of
    /// the range, since it had to merge the mini-page with the leaf page anyway.
    ///
    /// (About 110 lines: one retry loop whose three outcomes — unlocked read, locked
    /// read, mirror promotion — share its restart logic.)
    pub(super) fn fetch(
        &self,
        lower: &Bound<Vec<u8>>,
        upper: &Bound<Vec<u8>>,
        (direction, limit): (Direction, usize),
        out: &mut impl Sink,
        (prefetched, read_ahead_pages): (&mut Vec<Prefetched>, usize),
    ) -> Result<Option<Bound<Vec<u8>>>> {
        let promote = self.promote_scan();
        // Leaf pages are read without the page lock (validated by the leaf-write counters
        // afterwards) until one such read goes stale; then the page is read under its
        // lock, which always finishes.
        let mut unlocked = true;
        let bounds = (lower, upper, direction);
        loop {
            let Some((path, page)) =
                self.lock_leaf(target(direction, lower, upper), MappingTable::read)
            else {
                return Ok(None);
            };
            if self.failed.load(Ordering::Acquire) {
                // A failed write may have left a leaf page wider than its range: the
                // careful path bounds every page by its range in its parent.
                drop(page);
                return self.fetch_routed((lower, upper), direction, out);
            }
            let plan = {
                // A mirror answers under the read lock, copying only what is asked for.
                if let Some(mini) = self.mini_page(&page)
                    && mini.header().mirror
                {
                    return Ok(take_from_mirror(
                        &mini.node(),
                        lower,
                        upper,
                        (direction, limit),
                        out,
                    ));
                }
                let plan = unlocked.then(|| {
                    self.plan_leaf_read(&path, &page, bounds, prefetched, read_ahead_pages)
                });
                drop(page);
                plan
            };
            let view = match plan {
                Some(plan) => {
                    let leaf = match self.read_planned(plan, prefetched) {
                        Some(leaf) => leaf,
                        None => {
                            unlocked = false;
                            continue;
                        }
                    };
                    if !promote && matches!(direction, Direction::Forward) {
                        // The common case: copy what is asked for straight from the nodes.
                        let page = self.mapping.read(leaf.ticket.pid);
                        if !self.ticket_valid(&leaf.ticket, &page) {
                            bump(&self.counters.stale_leaf_reads);
                            unlocked = false;
                            continue;
                        }
                        let bounds = (lower, upper);
                        return self.page_forward(&page, Some(&leaf.page), bounds, out);
                    }
                    match self.view_of_read(&leaf, promote)? {
                        Some(view) => view,
                        None => {
                            bump(&self.counters.stale_leaf_reads);
                            unlocked = false;
                            continue;
                        }
                    }
                }
                None if promote && self.check_writable().is_ok() => {
                    let page = self.mapping.write(path.pid);
                    if path.validate().is_err() {
                        bump(&self.counters.restarts);
                        continue;
                    }
                    let ahead = (&mut *prefetched, read_ahead_pages);
                    let view = self.view_prefetching(&path, &page, bounds, ahead)?;
                    self.make_mirror(&page, &view);
                    view
                }
                None => {
                    let page = self.mapping.read(path.pid);
                    if path.validate().is_err() {
                        bump(&self.counters.restarts);
                        continue;
                    }
                    let ahead = (&mut *prefetched, read_ahead_pages);
                    self.view_prefetching(&path, &page, bounds, ahead)?
                }
            };
            let in_range = |k: &[u8]| above(lower, k) && below(upper, k);
            return Ok(match direction {
                Direction::Forward => take_forward(view, lower, upper, out),
                Direction::Backward => {
                    for (key, value, external) in view.records.iter().rev() {
                        if in_range(key) {
                            out.push_parts(key, value, external);
                        }
                    }
                    view.low.map(Bound::Excluded)
                }
            });
        }
    }

    /// The error for a scan whose fetch did not move its bound (`FetchState::fetch`):
    /// the leaf page of the page it fetched from has fences that are not the page's
    /// range (a mirror built from it copied them). Names that leaf page and poisons the
    /// tree.
    fn stalled_scan(
        &self,
        lower: &Bound<Vec<u8>>,
        upper: &Bound<Vec<u8>>,
        direction: Direction,
    ) -> Error {
        let reason = "a scan fetching from it made no progress: its fences are not its range";
        match self.lock_leaf(target(direction, lower, upper), MappingTable::read) {
            Some((_, page)) => {
                let no = self.leaf_of(&page);
                drop(page);
                self.damaged_leaf(no, reason)
            }
            None => self.damaged_leaf(PageNo(0), reason),
        }
    }

    /// A fetch for a tree a failed write poisoned (as `fetch`, one page under its lock,
    /// no read-ahead or promotion): the page's records and the bound it returns come
    /// from its routing range in its parent, not from its leaf page's fences. While the
    /// tree is sound the two agree (a split or redistribution rewrites a page before it
    /// releases the page's lock), but a leaf write that failed after a split published
    /// its separator leaves the page's old, wider fences on disk, and records of the
    /// right-hand part there are stale copies.
    fn fetch_routed(
        &self,
        (lower, upper): (&Bound<Vec<u8>>, &Bound<Vec<u8>>),
        direction: Direction,
        out: &mut impl Sink,
    ) -> Result<Option<Bound<Vec<u8>>>> {
        loop {
            let Some((path, page)) =
                self.lock_leaf(target(direction, lower, upper), MappingTable::read)
            else {
                return Ok(None);
            };
            let Ok((low, high)) = path.routing_range() else {
                drop(page);
                bump(&self.counters.restarts);
                continue;
            };
            let view = self.page_view(&page, None)?;
            drop(page);
            let routed = |k: &[u8]| k >= low.as_slice() && high.as_deref().is_none_or(|h| k < h);
            let in_range = |k: &[u8]| above(lower, k) && below(upper, k) && routed(k);
            return Ok(match direction {
                Direction::Forward => {
                    for (key, value, external) in view.records.iter().filter(|r| in_range(r.0)) {
                        out.push_parts(key, value, external);
                    }
                    high.map(Bound::Included)
                }
                Direction::Backward => {
                    let records = view.records.iter().rev();
                    for (key, value, external) in records.filter(|r| in_range(r.0)) {
                        out.push_parts(key, value, external);
                    }
                    (!low.is_empty()).then_some(Bound::Excluded(low))
                }
            });
        }
    }

    /// What a fetch reads without the page lock, decided under it (the caller holds
    /// `path.pid`'s lock, `page`, and it is not a mirror): the page's leaf
    /// page from the pages read ahead if one is there and still valid, else a read of
    /// it together with the next pages of the range.
    fn plan_leaf_read(
        &self,
        path: &LeafPath<'_>,
        page: &impl PageLock,
        bounds: (&Bound<Vec<u8>>, &Bound<Vec<u8>>, Direction),
        prefetched: &mut Vec<Prefetched>,
        read_ahead_pages: usize,
    ) -> LeafRead {
        if let Some(i) = prefetched.iter().position(|p| p.ticket.pid == path.pid) {
            let p = prefetched.swap_remove(i);
            if self.ticket_valid(&p.ticket, page) {
                return LeafRead::Prefetched(p);
            }
            bump(&self.counters.stale_leaf_reads);
        }
        LeafRead::Read {
            ticket: self.ticket(path.pid, page, 0),
            ahead: self.pages_ahead(path, bounds, read_ahead_pages),
        }
    }

    /// Carries out a `plan_leaf_read` without any page lock (or, from `view_prefetching`,
    /// under it): the page, with its ticket. Pages read ahead replace `prefetched`.
    /// `None`: the batch failed (a page read while a writer rewrote it fails its
    /// checksum); the caller reads under the lock, which reports a real error.
    fn read_planned(&self, plan: LeafRead, prefetched: &mut Vec<Prefetched>) -> Option<Prefetched> {
        let (ticket, ahead) = match plan {
            LeafRead::Prefetched(p) => return Some(p),
            LeafRead::Read { ticket, ahead } => (ticket, ahead),
        };
        // Pages read ahead earlier lie behind the scan now (or were skipped): drop them.
        prefetched.clear();
        let mut nos = Vec::with_capacity(ahead.len() + 1);
        nos.push(ticket.leaf);
        nos.extend(ahead.iter().map(|t| t.leaf));
        let mut pages: Vec<LeafPage> = nos.iter().map(|_| self.new_leaf_page()).collect();
        self.read_leaves(&nos, &mut pages).ok()?;
        bump_by(&self.counters.prefetched_leaf_pages, ahead.len());
        let mut pages = pages.into_iter();
        let this = pages.next().expect("this page was read");
        prefetched.extend(
            ahead
                .into_iter()
                .zip(pages)
                .map(|(ticket, page)| Prefetched { ticket, page }),
        );
        Some(Prefetched { ticket, page: this })
    }

    /// The view of a page whose leaf page `leaf` was read without the lock, taking the
    /// page's lock again to validate the read (and, with `promote`, its write lock to
    /// make the page a mirror). `Ok(None)`: the read is stale.
    fn view_of_read(&self, leaf: &Prefetched, promote: bool) -> Result<Option<PageView>> {
        let ticket = &leaf.ticket;
        if promote && self.check_writable().is_ok() {
            let page = self.mapping.write(ticket.pid);
            if !self.ticket_valid(ticket, &page) {
                return Ok(None);
            }
            let view = self.page_view(&page, Some(&leaf.page))?;
            self.make_mirror(&page, &view);
            return Ok(Some(view));
        }
        let page = self.mapping.read(ticket.pid);
        if !self.ticket_valid(ticket, &page) {
            return Ok(None);
        }
        Ok(Some(self.page_view(&page, Some(&leaf.page))?))
    }

    /// The first half of a forward fetch whose leaf page is read without the page lock
    /// (the async scan): fetches the page holding `lower` if it needs no leaf page (a
    /// mirror), else returns a ticket for reading its leaf page. `Ok(None)`: nothing
    /// was left to fetch.
    #[cfg(feature = "tokio-uring")]
    pub(crate) fn fetch_or_ticket(
        &self,
        lower: &Bound<Vec<u8>>,
        upper: &Bound<Vec<u8>>,
        out: &mut Buffered,
    ) -> Result<FetchStep> {
        let key = match lower {
            Bound::Included(k) | Bound::Excluded(k) => k.as_slice(),
            Bound::Unbounded => &[],
        };
        let (path, page) = self.lock_leaf_of(key, MappingTable::read);
        if !self.is_mirror(&page) {
            return Ok(FetchStep::Leaf(self.ticket(path.pid, &page, 0)));
        }
        let view = self.page_view(&page, None)?;
        Ok(FetchStep::Fetched(take_forward(view, lower, upper, out)))
    }

    /// The second half: fetches the ticket's page into `out` with `leaf_page` as read
    /// without the lock since the ticket was taken (as `fetch` does, turning the page
    /// into a mirror with `promote`). `Ok(None)`: the read is stale, start again.
    #[cfg(feature = "tokio-uring")]
    pub(crate) fn fetch_with_leaf(
        &self,
        ticket: &LeafTicket,
        leaf_page: &LeafPage,
        (lower, upper): (&Bound<Vec<u8>>, &Bound<Vec<u8>>),
        out: &mut Buffered,
        promote: bool,
    ) -> Result<Option<Option<Bound<Vec<u8>>>>> {
        let view = if promote && self.check_writable().is_ok() {
            let page = self.mapping.write(ticket.pid);
            if !self.ticket_valid(ticket, &page) {
                return Ok(None);
            }
            let view = self.page_view(&page, Some(leaf_page))?;
            self.make_mirror(&page, &view);
            view
        } else {
            let page = self.mapping.read(ticket.pid);
            if !self.ticket_valid(ticket, &page) {
                return Ok(None);
            }
            self.page_view(&page, Some(leaf_page))?
        };
        Ok(Some(take_forward(view, lower, upper, out)))
    }

    /// The page's view (as `page_view`), taking its leaf page from the pages read ahead
    /// if one is there and still valid; otherwise reading it together with the next
    /// pages of the range in one batch. The caller holds `path.pid`'s lock.
    fn view_prefetching(
        &self,
        path: &LeafPath<'_>,
        page: &impl PageLock,
        bounds: (&Bound<Vec<u8>>, &Bound<Vec<u8>>, Direction),
        (prefetched, read_ahead_pages): (&mut Vec<Prefetched>, usize),
    ) -> Result<PageView> {
        if self.is_mirror(page) {
            return self.page_view(page, None);
        }
        // The same plan as a fetch without the lock makes, carried out under the lock.
        let leaf = match self.plan_leaf_read(path, page, bounds, prefetched, read_ahead_pages) {
            // Nothing to read ahead: `page_view` reads the page alone.
            LeafRead::Read { ahead, .. } if ahead.is_empty() => None,
            // `None` from a failed batch: a page read ahead may have failed its checksum
            // because a writer was rewriting it, so this page is read alone, which
            // reports a real error.
            plan => self.read_planned(plan, prefetched),
        };
        self.page_view(page, leaf.as_ref().map(|p| &p.page))
    }

    /// Whether a location is a mirror (its mini-page holds every record of the leaf).
    /// The caller holds the page's lock.
    fn is_mirror(&self, page: &impl PageLock) -> bool {
        self.mini_page(page).is_some_and(|m| m.header().mirror)
    }

    /// Tickets for up to `max_pages` pages after `path.pid` in the scan's direction
    /// that hold keys of the range, are children of the same parent and need their leaf
    /// page (mirrors do not). The caller holds `path.pid`'s lock, so the other pages are
    /// only try-locked: a thread holding a page lock never waits for another.
    fn pages_ahead(
        &self,
        path: &LeafPath<'_>,
        (lower, upper, direction): (&Bound<Vec<u8>>, &Bound<Vec<u8>>, Direction),
        max_pages: usize,
    ) -> Vec<LeafTicket> {
        let mut pids = Vec::new();
        if max_pages == 0 {
            return Vec::new();
        }
        {
            let guard = epoch::pin();
            // The parent as the traversal saw it, else `path.index` may not be the
            // page's position any more (a split since): prefetch nothing.
            let Some(parent) = path.parent_snapshot(&guard) else {
                return Vec::new();
            };
            let n = parent.view();
            let mut low = Vec::new();
            match direction {
                Direction::Forward => {
                    let end = n.len().min(path.index + 1 + max_pages);
                    for j in path.index + 1..end {
                        // Child j's keys start at its separator: in range, or stop.
                        n.key_into(j, &mut low);
                        if !below(upper, &low) {
                            break;
                        }
                        pids.push(PageId(inner::child_ref(&n, j)));
                    }
                }
                Direction::Backward => {
                    let start = path.index.saturating_sub(max_pages);
                    for j in (start..path.index.min(n.len())).rev() {
                        // Child j's keys lie below child j+1's separator.
                        n.key_into(j + 1, &mut low);
                        if !above_strictly(lower, &low) {
                            break;
                        }
                        pids.push(PageId(inner::child_ref(&n, j)));
                    }
                }
            }
            // Keys were read from the snapshot: they are the neighbours' only if the
            // parent did not change meanwhile.
            if parent.validate().is_err() {
                return Vec::new();
            }
        }
        let mut tickets = Vec::with_capacity(pids.len());
        for pid in pids {
            let Some(page) = self.mapping.try_read(pid) else {
                continue;
            };
            let location = page.location();
            if location != Location::Empty && !self.is_mirror(&page) {
                tickets.push(self.ticket(pid, &page, 0));
            }
        }
        tickets
    }

    /// The live records of a page and its fences, with `leaf` as its leaf page if given
    /// (already validated), else reading it. The caller holds the page's lock.
    fn page_view(&self, page: &impl PageLock, leaf: Option<&LeafPage>) -> Result<PageView> {
        // Keys get their prefixes back: about twice the page's bytes, grown if needed.
        let mut records = Flat::with_capacity(0, 2 * self.leaf.node_bytes());
        let (low, high) = self.merge_page(page, leaf, |r| {
            records.push_view(r);
            true
        })?;
        Ok(PageView { records, low, high })
    }

    /// Copies the records of a page in `[lower, upper)` to the back of `out`, ascending,
    /// straight from its nodes (as `take_forward(page_view(..))` without building the
    /// whole page's view), and returns the new lower bound of the unfetched range
    /// (`None` after the last page). The caller holds the page's lock.
    fn page_forward(
        &self,
        page: &impl PageLock,
        leaf: Option<&LeafPage>,
        (lower, upper): (&Bound<Vec<u8>>, &Bound<Vec<u8>>),
        out: &mut impl Sink,
    ) -> Result<Option<Bound<Vec<u8>>>> {
        let (_, high) = self.merge_page(page, leaf, |r| {
            if !view_below(upper, r) {
                return false;
            }
            if view_above(lower, r) {
                out.push_view(r);
            }
            true
        })?;
        Ok(high.map(Bound::Included))
    }

    /// Passes the live records of a page to `emit` in key order, merged from its
    /// mini-page (newer) and leaf page (`leaf` if given, already validated, else read),
    /// until `emit` answers false; returns the page's fences. The caller holds the page's
    /// lock.
    fn merge_page(
        &self,
        page: &impl PageLock,
        leaf: Option<&LeafPage>,
        emit: impl FnMut(&RecordView<'_>) -> bool,
    ) -> Result<OwnedFences> {
        // A scan may turn the page into a mirror from what it merged (`make_mirror`),
        // which is merged without reading the leaf page again: the leaf versions the
        // mini-page shadows go to the value store here (`values.rs`).
        let mut replaced = super::values::Replaced::default();
        let fences = self.merge_page_noting(page, leaf, emit, &mut replaced);
        self.release_replaced(replaced);
        fences
    }

    /// [`Core::merge_page`], noting in `replaced` the leaf versions the mini-page's
    /// dirty records shadow.
    fn merge_page_noting(
        &self,
        page: &impl PageLock,
        leaf: Option<&LeafPage>,
        mut emit: impl FnMut(&RecordView<'_>) -> bool,
        replaced: &mut super::values::Replaced,
    ) -> Result<OwnedFences> {
        let fence = super::owned_fence;
        let (mini, leaf_no) = match page.location() {
            Location::Mini(_) => {
                let mini_page = self.mini_page(page).expect("the page maps a mini-page");
                let (header, mini) = (mini_page.header(), mini_page.node());
                if header.mirror {
                    for r in mini.iter().filter(|r| r.record_type().exists()) {
                        if !emit(&r) {
                            break;
                        }
                    }
                    return Ok((fence(mini.low_fence()), fence(mini.high_fence())));
                }
                (Some(mini), header.leaf)
            }
            Location::Leaf(no) => (None, PageNo(no)),
            Location::Empty => unreachable!("a routed page id is in use"),
        };
        let mut leaf_page;
        let leaf = match leaf {
            Some(given) => self.parse_leaf(leaf_no, given)?,
            None => {
                leaf_page = self.new_leaf_page();
                self.read_leaf(leaf_no, &mut leaf_page)?
            }
        };
        // A scan goes on at the fence it returns: a page whose fences are not its
        // range would send it back or past pages.
        self.check_route(page.id(), leaf_no, &leaf)?;
        let fences = (fence(leaf.low_fence()), fence(leaf.high_fence()));
        let mut m = mini.iter().flat_map(|m| m.iter()).peekable();
        let mut k = Vec::new();
        for r in leaf.iter() {
            r.key_into(&mut k);
            while let Some(mr) = m.next_if(|mr| mr.cmp_key(&k).is_lt()) {
                if mr.record_type().exists() && !emit(&mr) {
                    return Ok(fences);
                }
            }
            let go_on = match m.next_if(|mr| mr.cmp_key(&k).is_eq()) {
                Some(newer) => {
                    if newer.record_type().is_dirty() {
                        let new = (newer.record_type(), newer.value());
                        replaced.note(&k, (r.record_type(), r.value()), new);
                    }
                    !newer.record_type().exists() || emit(&newer)
                }
                None => emit(&r),
            };
            if !go_on {
                return Ok(fences);
            }
        }
        for mr in m {
            if mr.record_type().exists() && !emit(&mr) {
                break;
            }
        }
        Ok(fences)
    }

    /// Turns the page's mini-page into a full mirror of its leaf page (§3.1 "caching
    /// range gaps"), so later scans and point reads of it need no IO. The caller holds
    /// the page's write lock and has just built `view` under it. Best effort.
    fn make_mirror(&self, page: &mapping::WriteGuard<'_>, view: &PageView) {
        let old = self.mini_page(page);
        let (old, leaf_no) = match page.location() {
            Location::Mini(_) => {
                let old = old.expect("the page maps a mini-page");
                let header = old.header();
                if header.mirror {
                    return;
                }
                (Some(old), header.leaf)
            }
            Location::Leaf(no) => (None, PageNo(no)),
            Location::Empty => return,
        };
        // Dirty records keep their type (they are not in the leaf page yet).
        let dirty: Vec<(Vec<u8>, RecordType)> = match old {
            Some(old) => {
                let mini = old.node();
                mini.iter()
                    .filter(|r| r.record_type().is_dirty())
                    .map(|r| (r.key(), r.record_type()))
                    .collect()
            }
            None => Vec::new(),
        };
        let Ok(mut block) = self.alloc(self.leaf.max_mini_block_bytes()) else {
            return;
        };
        let bytes = block.bytes_mut();
        MiniHeader {
            pid: page.id(),
            leaf: leaf_no,
            mirror: true,
            owner: self.owner,
        }
        .write(bytes);
        let fences = Fences::Range {
            low: view.low.as_deref(),
            high: view.high.as_deref(),
        };
        let node_bytes = &mut bytes[MINI_HEADER_BYTES..];
        let records = view.records.iter().map(|(k, v, external)| {
            let clean = if external {
                RecordType::CacheExternal
            } else {
                RecordType::Cache
            };
            let t = dirty
                .binary_search_by(|(dk, _)| dk.as_slice().cmp(k))
                .map_or(clean, |i| dirty[i].1);
            (k, v, t)
        });
        // Tombstones of keys the leaf still holds must survive too.
        let mut all: Vec<(&[u8], &[u8], RecordType)> = records.collect();
        for (k, t) in &dirty {
            if *t == RecordType::Tombstone
                && let Err(i) = all.binary_search_by(|(ak, _, _)| (*ak).cmp(k.as_slice()))
            {
                all.insert(i, (k.as_slice(), &[], RecordType::Tombstone));
            }
        }
        if node::build_sorted(node_bytes, NodeKind::Mini, fences, all).is_err() {
            self.discard(block);
            // Does not fit in one block because of the dirty records: merge them now,
            // so that the next scan of the page can mirror it instead of trying (under
            // the write lock) again and again. `view` stays what this fetch returns: a
            // merge changes where records live, not which records exist.
            if old.is_some() {
                self.merge_for_mirror(page, leaf_no);
            }
            return;
        }
        let old = old.map(|m| m.block());
        self.publish(page, block);
        if let Some(old) = old {
            self.retire(old);
        }
        bump(&self.counters.mirrors_created);
    }
}
