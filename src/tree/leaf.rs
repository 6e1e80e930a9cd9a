//! Mini-page blocks and leaf-page building (Bf-Tree §3.1-3.3, §5.5).
//!
//! A mini-page lives in a pool block whose payload starts with a 16-byte header:
//!
//! ```text
//! 0..8    PageId that owns the mini-page (u64 LE) — the eviction callback's way back
//! 8..14   leaf page number (48 bits LE)
//! 14..16  flags (u16 LE): bit 0 = MIRROR (the mini-page holds every record of its leaf);
//!         bits 1..16 = owner, the tree's slot in the pool it may share with other trees
//!         (`members::TreePool`), which eviction dispatches on
//! 16..    the mini-page node (shared node layout, kind Mini)
//! ```
//!
//! The header is written before the block is published and never changes afterwards.
//! A regular mini-page carries its leaf's key prefix (`Fences::Prefix`) or none; a mirror
//! carries the leaf's two fence keys (`Fences::Range`), so it can answer misses and scans
//! without the leaf page.

use crate::pool::Block;
use crate::storage::PageNo;

use super::mapping::PageId;
use super::node::{
    self, Fences, KV_META_SIZE_BYTES, NODE_META_SIZE_BYTES, NodeKind, NodeMut, NodeRef, RecordType,
    WriteError,
};

const MIRROR: u16 = 1;

/// Bytes a mini-page block spends before its node: page id, leaf page and flags.
pub(crate) const MINI_HEADER_BYTES: usize = 16;

/// The fixed header of a mini-page block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MiniHeader {
    pub(crate) pid: PageId,
    pub(crate) leaf: PageNo,
    pub(crate) mirror: bool,
    /// The owning tree's member slot in its pool (below `members::MAX_MEMBERS`).
    pub(crate) owner: u16,
}

impl MiniHeader {
    pub(crate) fn write(&self, payload: &mut [u8]) {
        payload[0..8].copy_from_slice(&self.pid.0.to_le_bytes());
        let leaf = self.leaf.0.to_le_bytes();
        payload[8..14].copy_from_slice(&leaf[..6]);
        debug_assert!(usize::from(self.owner) < super::members::MAX_MEMBERS);
        let flags = if self.mirror { MIRROR } else { 0 } | (self.owner << 1);
        payload[14..16].copy_from_slice(&flags.to_le_bytes());
    }

    pub(crate) fn read(payload: &[u8]) -> MiniHeader {
        let pid = u64::from_le_bytes(payload[0..8].try_into().expect("8 bytes"));
        let mut leaf = [0u8; 8];
        leaf[..6].copy_from_slice(&payload[8..14]);
        let flags = u16::from_le_bytes(payload[14..16].try_into().expect("2 bytes"));
        MiniHeader {
            pid: PageId(pid),
            leaf: PageNo(u64::from_le_bytes(leaf)),
            mirror: flags & MIRROR != 0,
            owner: flags >> 1,
        }
    }

    /// Reads the header of a block.
    ///
    /// # Safety
    ///
    /// The block must be allocated and published (its header written), and must not be
    /// freed while this runs. The header is never written after publication, so reading
    /// it needs no page lock.
    pub(crate) unsafe fn of(block: &Block) -> MiniHeader {
        // SAFETY: the caller guarantees the block is live; the first 16 bytes are the
        // immutable header, which no one writes after publication.
        let header = unsafe { std::slice::from_raw_parts(block.payload_ptr(), MINI_HEADER_BYTES) };
        MiniHeader::read(header)
    }
}

/// Bytes an empty mini-page node with `fences` needs.
pub(crate) fn empty_node_bytes(fences: &Fences<'_>) -> usize {
    NODE_META_SIZE_BYTES + fences.size_bytes()
}

/// Bytes one record costs in a node: its KV meta, its stored key and its value (pass the
/// key length without the node's prefix for the exact cost, with it for an upper bound).
pub(crate) fn record_cost(key_len: usize, value_len: usize) -> usize {
    KV_META_SIZE_BYTES + key_len + value_len
}

/// The prefix every key between two fences shares: their common prefix, or none if one
/// is unbounded.
pub(crate) fn fences_prefix_len(low: Option<&[u8]>, high: Option<&[u8]>) -> usize {
    match (low, high) {
        (Some(l), Some(h)) => node::common_prefix_len(l, h),
        _ => 0,
    }
}

/// The shortest key `s` with `left < s <= right` (suffix truncation of separators): a
/// prefix of `right`.
pub(crate) fn separator<'a>(left: &[u8], right: &'a [u8]) -> &'a [u8] {
    debug_assert!(left < right);
    let common = node::common_prefix_len(left, right);
    &right[..(common + 1).min(right.len())]
}

/// Records in strictly increasing key order, owned in one byte buffer: what a merge
/// builds its leaf pages from. Two vectors however many records (a vector per key and
/// per value cost a merge into a full page ~260 allocations, a tenth of a load's CPU).
#[derive(Debug, Default, Clone)]
pub(crate) struct RecordList {
    /// Key then value bytes of every record (and of replaced records, until dropped).
    bytes: Vec<u8>,
    spans: Vec<Span>,
}

/// Where one record of a [`RecordList`] lies in its bytes.
#[derive(Debug, Clone, Copy)]
struct Span {
    at: u32,
    key_len: u32,
    value_len: u32,
    t: RecordType,
}

impl RecordList {
    /// An empty list with room for `records` records of `bytes` key and value bytes.
    pub(crate) fn with_capacity(records: usize, bytes: usize) -> RecordList {
        RecordList {
            bytes: Vec::with_capacity(bytes),
            spans: Vec::with_capacity(records),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.spans.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Stores a record made of `key_parts` (concatenated) and `value`, and returns its span.
    fn store(&mut self, key_parts: [&[u8]; 2], value: &[u8], t: RecordType) -> Span {
        let at = self.bytes.len();
        for part in key_parts {
            self.bytes.extend_from_slice(part);
        }
        let key_len = self.bytes.len() - at;
        self.bytes.extend_from_slice(value);
        let narrow = |n: usize| u32::try_from(n).expect("a merge holds under 4 GiB");
        Span {
            at: narrow(at),
            key_len: narrow(key_len),
            value_len: narrow(value.len()),
            t,
        }
    }

    /// Appends a record whose key is above every key in the list.
    pub(crate) fn push(&mut self, key: &[u8], value: &[u8], t: RecordType) {
        debug_assert!(
            self.spans
                .last()
                .is_none_or(|_| self.key(self.len() - 1) < key)
        );
        let span = self.store([key, &[]], value, t);
        self.spans.push(span);
    }

    /// Appends a node's record (full key: the node's prefix then the stored suffix) with
    /// type `t`, without assembling its key elsewhere first.
    pub(crate) fn push_view(&mut self, r: &node::RecordView<'_>, t: RecordType) {
        debug_assert!(
            self.spans
                .last()
                .is_none_or(|_| r.cmp_key(self.key(self.len() - 1)).is_gt())
        );
        let span = self.store([r.prefix(), r.suffix()], r.value(), t);
        self.spans.push(span);
    }

    /// Where `key` is, or would be inserted.
    pub(crate) fn search(&self, key: &[u8]) -> Result<usize, usize> {
        self.spans
            .binary_search_by(|s| self.bytes[s.at as usize..][..s.key_len as usize].cmp(key))
    }

    /// Puts `key` in its place: replaces the record holding it, or inserts one.
    pub(crate) fn upsert(&mut self, key: &[u8], value: &[u8], t: RecordType) {
        let found = self.search(key);
        let span = self.store([key, &[]], value, t);
        match found {
            Ok(i) => self.spans[i] = span,
            Err(i) => self.spans.insert(i, span),
        }
    }

    /// Drops record `i` (its bytes stay until the list is dropped).
    pub(crate) fn remove(&mut self, i: usize) {
        self.spans.remove(i);
    }

    pub(crate) fn key(&self, i: usize) -> &[u8] {
        let s = self.spans[i];
        &self.bytes[s.at as usize..][..s.key_len as usize]
    }

    pub(crate) fn value(&self, i: usize) -> &[u8] {
        let s = self.spans[i];
        &self.bytes[(s.at + s.key_len) as usize..][..s.value_len as usize]
    }

    pub(crate) fn record_type(&self, i: usize) -> RecordType {
        self.spans[i].t
    }

    /// Key length and value length of record `i`, without touching its bytes.
    fn lens(&self, i: usize) -> (usize, usize) {
        let s = self.spans[i];
        (s.key_len as usize, s.value_len as usize)
    }

    /// Bytes record `i` costs in a node whose keys share a prefix of `prefix_len` bytes:
    /// its meta, stored key suffix and value.
    fn cost(&self, i: usize, prefix_len: usize) -> usize {
        let (k, v) = self.lens(i);
        record_cost(k - prefix_len, v)
    }

    /// What all the records cost in such a node.
    pub(crate) fn cost_bytes(&self, prefix_len: usize) -> usize {
        (0..self.len()).map(|i| self.cost(i, prefix_len)).sum()
    }

    /// `(key, value, type)` of records `range`, in key order.
    pub(crate) fn iter_range(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (&[u8], &[u8], RecordType)> + '_ {
        range.map(|i| (self.key(i), self.value(i), self.record_type(i)))
    }

    /// `(key, value, type)` of every record, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8], RecordType)> + '_ {
        self.iter_range(0..self.len())
    }
}

impl<K: AsRef<[u8]>, V: AsRef<[u8]>> FromIterator<(K, V)> for RecordList {
    /// Collects `(key, value)` pairs in strictly increasing key order as `Insert` records.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> RecordList {
        let mut list = RecordList::default();
        for (k, v) in pairs {
            list.push(k.as_ref(), v.as_ref(), RecordType::Insert);
        }
        list
    }
}

/// One leaf page's worth of records and its fences, produced by [`pack_leaves`].
pub(crate) struct LeafChunk {
    pub(crate) low: Option<Vec<u8>>,
    pub(crate) high: Option<Vec<u8>>,
    pub(crate) records: std::ops::Range<usize>,
}

/// How a split spreads records over its pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fill {
    /// About the same bytes in every page: right for inserts in random key order, which
    /// land in both halves alike.
    Balanced,
    /// Every page full but the last: the new records all lie above the page's old
    /// ones (keys inserted in ascending order), so no later insert lands in the lower
    /// pages, and half-full ones would stay half full.
    Ascending,
    /// Every page full but the first: the new records all lie below the old ones
    /// (descending order).
    Descending,
}

/// Splits sorted records into as few leaf pages as fit, spread as `fill` says; the
/// first chunk keeps `low`, the last `high`, and neighbours share a suffix-truncated
/// separator.
pub(crate) fn pack_leaves(
    records: &RecordList,
    low: Option<&[u8]>,
    high: Option<&[u8]>,
    fill: Fill,
    node_bytes: usize,
) -> Vec<LeafChunk> {
    // Every chunk's range lies inside [low, high), so every chunk's prefix is at least
    // the common prefix of `low` and `high`: costing keys without it is a tight upper
    // bound. (Costing full keys made a page of long shared-prefix keys "need" dozens of
    // pages, and sent dozens of separators to one inner node.)
    let prefix_len = fences_prefix_len(low, high);
    let cost = |i: usize| records.cost(i, prefix_len);
    let total = records.cost_bytes(prefix_len);
    let fence_bound = |l: Option<&[u8]>, h: Option<&[u8]>| {
        2 * KV_META_SIZE_BYTES + l.map_or(0, <[u8]>::len) + h.map_or(0, <[u8]>::len)
    };
    if fill != Fill::Balanced
        && !records.is_empty()
        && let Some(chunks) = pack_full(records, (low, high), fill, node_bytes)
    {
        return chunks;
    }
    // Try 1, 2, 3, ... pages until every chunk's worst-case size fits.
    let mut pages = 1;
    loop {
        if let Some(chunks) = try_pack(
            records,
            (low, high),
            (pages, total.div_ceil(pages)),
            &cost,
            &fence_bound,
            node_bytes,
        ) {
            return chunks;
        }
        pages += 1;
        assert!(
            pages <= records.len().max(1),
            "a single record always fits a leaf page"
        );
    }
}

/// Packs a sorted-order split (`fill` not balanced) whose open end, the page that the
/// next records of that order land in, must hold record `open`: the pages on the stream's
/// far side of it are packed full as by `pack_leaves`, a page boundary falls right past
/// `open` (ascending: above it; descending: below), and the records beyond the boundary
/// (old records on the stream's near side: another stream's, or older data) get pages of
/// their own, balanced, unless they fit in the open end's page. Without the boundary a
/// stream inserting into the middle of a page (below older records) found its next key
/// in a page packed full, which then split again, balanced. Returns the chunks and the
/// index of the open end's.
pub(crate) fn pack_open(
    records: &RecordList,
    low: Option<&[u8]>,
    high: Option<&[u8]>,
    fill: Fill,
    open: usize,
    node_bytes: usize,
) -> (Vec<LeafChunk>, usize) {
    let n = records.len();
    let at = match fill {
        Fill::Ascending => open + 1,
        _ => open,
    };
    if fill == Fill::Balanced || at == 0 || at >= n {
        let chunks = pack_leaves(records, low, high, fill, node_bytes);
        let open = chunks
            .iter()
            .position(|c| open < c.records.end)
            .unwrap_or(0);
        return (chunks, open);
    }
    let sep = separator(records.key(at - 1), records.key(at)).to_vec();
    // Packs `range` of the records between the fences `lo` and `hi`.
    let pack = |range: std::ops::Range<usize>, lo: Option<&[u8]>, hi: Option<&[u8]>, fill| {
        let part: RecordList = records
            .iter_range(range.clone())
            .map(|(k, v, _)| (k, v))
            .collect();
        let mut chunks = pack_leaves(&part, lo, hi, fill, node_bytes);
        for c in &mut chunks {
            c.records = c.records.start + range.start..c.records.end + range.start;
        }
        chunks
    };
    if fill == Fill::Ascending {
        let mut chunks = pack(0..at, low, Some(&sep), fill);
        let last = chunks.pop().expect("a packing has a chunk");
        let joined = pack(
            last.records.start..n,
            last.low.as_deref(),
            high,
            Fill::Balanced,
        );
        let open = chunks.len();
        if joined.len() == 1 {
            chunks.extend(joined);
        } else {
            chunks.push(last);
            chunks.extend(pack(at..n, Some(&sep), high, Fill::Balanced));
        }
        (chunks, open)
    } else {
        let mut right = pack(at..n, Some(&sep), high, fill);
        let first = right.remove(0);
        let joined = pack(
            0..first.records.end,
            low,
            first.high.as_deref(),
            Fill::Balanced,
        );
        let mut chunks = if joined.len() == 1 {
            joined
        } else {
            let mut left = pack(0..at, low, Some(&sep), Fill::Balanced);
            left.push(first);
            left
        };
        let open = chunks.len() - 1;
        chunks.extend(right);
        (chunks, open)
    }
}

/// Packs every page as full as it goes but one end's (`Fill::Ascending`: the last page
/// takes what is left; `Fill::Descending`: the first), each page's size computed
/// exactly: its fences and the records' keys without the prefix those fences give.
/// `None` if a single record does not fit next to its fences (the caller balances).
fn pack_full(
    records: &RecordList,
    (low, high): (Option<&[u8]>, Option<&[u8]>),
    fill: Fill,
    node_bytes: usize,
) -> Option<Vec<LeafChunk>> {
    let n = records.len();
    // full[i]: the records before i at full key length.
    let mut full = Vec::with_capacity(n + 1);
    full.push(0usize);
    for i in 0..n {
        let (k, v) = records.lens(i);
        full.push(full[i] + record_cost(k, v));
    }
    // The separator between records i - 1 and i.
    let sep = |i: usize| separator(records.key(i - 1), records.key(i));
    let fits = |from: usize, to: usize, lo: Option<&[u8]>, hi: Option<&[u8]>| {
        let fences = Fences::Range { low: lo, high: hi };
        let prefix = fences.prefix().len();
        NODE_META_SIZE_BYTES + fences.size_bytes() + full[to] - full[from] - (to - from) * prefix
            <= node_bytes
    };
    // Chunk boundaries: ends[j] is where chunk j ends (exclusive).
    let mut ends = Vec::new();
    if fill == Fill::Descending {
        let mut end = n;
        while end > 0 {
            let hi = if end == n { high } else { Some(sep(end)) };
            let mut from = end;
            while from > 0 {
                let lo = if from - 1 == 0 {
                    low
                } else {
                    Some(sep(from - 1))
                };
                if !fits(from - 1, end, lo, hi) {
                    break;
                }
                from -= 1;
            }
            if from == end {
                return None;
            }
            ends.push(end);
            end = from;
        }
        ends.reverse();
    } else {
        let mut start = 0;
        while start < n {
            let lo = if start == 0 { low } else { Some(sep(start)) };
            let mut to = start;
            while to < n {
                let hi = if to + 1 == n { high } else { Some(sep(to + 1)) };
                if !fits(start, to + 1, lo, hi) {
                    break;
                }
                to += 1;
            }
            if to == start {
                return None;
            }
            ends.push(to);
            start = to;
        }
    }
    let mut chunks = Vec::with_capacity(ends.len());
    let mut start = 0;
    for end in ends {
        chunks.push(LeafChunk {
            low: if start == 0 {
                low.map(<[u8]>::to_vec)
            } else {
                Some(sep(start).to_vec())
            },
            high: if end == n {
                high.map(<[u8]>::to_vec)
            } else {
                Some(sep(end).to_vec())
            },
            records: start..end,
        });
        start = end;
    }
    Some(chunks)
}

type CostFn<'a> = dyn Fn(usize) -> usize + 'a;
type FenceBoundFn<'a> = dyn Fn(Option<&[u8]>, Option<&[u8]>) -> usize + 'a;

/// Packs `records` into at most `pages` chunks of about `target` bytes each; `None` if
/// they do not fit. The last chunk takes everything left: without that rule the last
/// record or two, past the target, became a page of their own, and a split meant to
/// make two half-full pages made a third almost empty one.
fn try_pack(
    records: &RecordList,
    (low, high): (Option<&[u8]>, Option<&[u8]>),
    (pages, target): (usize, usize),
    cost: &CostFn<'_>,
    fence_bound: &FenceBoundFn<'_>,
    node_bytes: usize,
) -> Option<Vec<LeafChunk>> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut chunk_low = low.map(<[u8]>::to_vec);
    while start < records.len() || chunks.is_empty() {
        let mut end = start;
        let mut bytes = 0;
        let last = chunks.len() + 1 >= pages;
        // Take records up to the target, at least one; the last chunk takes the rest.
        while end < records.len() && (end == start || last || bytes + cost(end) <= target) {
            bytes += cost(end);
            end += 1;
        }
        let (chunk_high, next_low) = if end < records.len() {
            let sep = separator(records.key(end - 1), records.key(end)).to_vec();
            (Some(sep.clone()), Some(sep))
        } else {
            (high.map(<[u8]>::to_vec), None)
        };
        let need =
            NODE_META_SIZE_BYTES + fence_bound(chunk_low.as_deref(), chunk_high.as_deref()) + bytes;
        if need > node_bytes {
            return None;
        }
        chunks.push(LeafChunk {
            low: chunk_low,
            high: chunk_high,
            records: start..end,
        });
        if end == records.len() {
            break;
        }
        chunk_low = next_low;
        start = end;
    }
    Some(chunks)
}

/// Builds a leaf page payload from `records` with the chunk's fences.
pub(crate) fn build_leaf(
    payload: &mut [u8],
    chunk: &LeafChunk,
    records: &RecordList,
) -> Result<(), node::WriteError> {
    node::build_sorted(
        payload,
        NodeKind::Leaf,
        Fences::Range {
            low: chunk.low.as_deref(),
            high: chunk.high.as_deref(),
        },
        records
            .iter_range(chunk.records.clone())
            .map(|(k, v, t)| (k, v, t.dirty())),
    )
    .map(|_| ())
}

/// Builds in `dst` a mirror of `leaf`: a mini-page node with the leaf's fence keys that
/// holds every record of the page (§3.1 "caching range gaps"), so later reads, misses
/// and scans of the page need no IO.
///
/// The dirty records of `mini` (the page's current mini-page, if any) are newer than
/// the leaf and win: an `Insert` keeps its type and value; a `Tombstone` of a key the
/// leaf holds stays a tombstone (the leaf page still has the key until a merge); a
/// tombstone of a key the leaf lacks says nothing and is dropped. Clean records of
/// `mini` repeat the leaf and are dropped too. The leaf's records become `Cache`.
///
/// Fails with [`WriteError::Full`] when the dirty records make the mirror larger than
/// `dst`; the caller then keeps the page as it is.
pub(crate) fn build_mirror<'d>(
    dst: &'d mut [u8],
    leaf: &NodeRef<'_>,
    mini: Option<&NodeRef<'_>>,
    replaced: &mut super::values::Replaced,
) -> Result<NodeMut<'d>, WriteError> {
    let mut out = NodeMut::init(dst, NodeKind::Mini, leaf.fences()).map_err(WriteError::Init)?;
    let mut dirty = mini
        .into_iter()
        .flat_map(|m| m.iter())
        .filter(|r| r.record_type().is_dirty())
        .peekable();
    let mut key = Vec::new();
    for r in leaf.iter() {
        r.key_into(&mut key);
        // Dirty records below this leaf record: inserts of new keys; tombstones of keys
        // the leaf does not hold are dropped.
        while let Some(d) = dirty.next_if(|d| d.cmp_key(&key).is_lt()) {
            if d.record_type().exists() {
                let mut dkey = Vec::new();
                d.key_into(&mut dkey);
                out.push(&dkey, d.value(), d.record_type())?;
            }
        }
        let newer = dirty.next_if(|d| d.cmp_key(&key).is_eq());
        if let Some(d) = &newer {
            replaced.note(
                &key,
                (r.record_type(), r.value()),
                (d.record_type(), d.value()),
            );
        }
        match newer {
            Some(d) if d.record_type().exists() => {
                out.push(&key, d.value(), d.record_type())?;
            }
            Some(_) => {
                out.push(&key, &[], RecordType::Tombstone)?;
            }
            None => {
                out.push(&key, r.value(), r.record_type().clean())?;
            }
        }
    }
    for d in dirty {
        if d.record_type().exists() {
            d.key_into(&mut key);
            out.push(&key, d.value(), d.record_type())?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::PAGE_PAYLOAD_SIZE;

    #[test]
    fn mirrors_hold_the_leaf_with_dirty_records_winning() {
        let mut leaf_buf = vec![0u8; PAGE_PAYLOAD_SIZE];
        let leaf_records: Vec<(Vec<u8>, Vec<u8>)> = (0..50u32)
            .map(|i| (format!("k{:03}", i * 2).into_bytes(), vec![b'l'; 8]))
            .collect();
        let leaf_list: RecordList = leaf_records.iter().map(|(k, v)| (k, v)).collect();
        let chunk = LeafChunk {
            low: Some(b"k".to_vec()),
            high: Some(b"l".to_vec()),
            records: 0..leaf_records.len(),
        };
        build_leaf(&mut leaf_buf, &chunk, &leaf_list).unwrap();
        let leaf = NodeRef::parse(&leaf_buf).unwrap();

        let mut mini_buf = vec![0u8; 1024];
        let mut mini = NodeMut::init(&mut mini_buf, NodeKind::Mini, Fences::Prefix(b"k")).unwrap();
        mini.push(b"k000", b"new", RecordType::Insert).unwrap(); // overrides a leaf key
        mini.push(b"k001", b"ins", RecordType::Insert).unwrap(); // a key the leaf lacks
        mini.push(b"k002", b"", RecordType::Tombstone).unwrap(); // deletes a leaf key
        mini.push(b"k003", b"", RecordType::Tombstone).unwrap(); // deletes nothing
        mini.push(b"k004", b"l", RecordType::Cache).unwrap(); // clean: repeats the leaf
        mini.push(b"k005", b"", RecordType::Phantom).unwrap(); // clean: a known miss
        mini.push(b"k999", b"end", RecordType::Insert).unwrap(); // after every leaf key
        let mini = mini.as_ref();

        let mut dst = vec![0u8; PAGE_PAYLOAD_SIZE];
        build_mirror(&mut dst, &leaf, Some(&mini), &mut Default::default()).unwrap();
        let mirror = NodeRef::parse(&dst).unwrap();
        assert_eq!(mirror.kind(), NodeKind::Mini);
        assert_eq!(mirror.fences(), leaf.fences());
        let got: Vec<(Vec<u8>, Vec<u8>, RecordType)> = mirror
            .iter()
            .map(|r| (r.key(), r.value().to_vec(), r.record_type()))
            .collect();
        let mut want: Vec<(Vec<u8>, Vec<u8>, RecordType)> = leaf_records
            .iter()
            .map(|(k, v)| (k.clone(), v.clone(), RecordType::Cache))
            .collect();
        want[0] = (b"k000".to_vec(), b"new".to_vec(), RecordType::Insert);
        want[1] = (b"k002".to_vec(), Vec::new(), RecordType::Tombstone);
        want.insert(1, (b"k001".to_vec(), b"ins".to_vec(), RecordType::Insert));
        want.push((b"k999".to_vec(), b"end".to_vec(), RecordType::Insert));
        assert_eq!(got, want);

        // A mirror that cannot hold the dirty records reports Full.
        let mut small = vec![0u8; 512];
        assert!(matches!(
            build_mirror(&mut small, &leaf, Some(&mini), &mut Default::default()),
            Err(WriteError::Full)
        ));
    }

    #[test]
    fn record_lists_keep_order_through_upserts_and_removals() {
        let mut list: RecordList = [("b", "1"), ("d", "2")].into_iter().collect();
        list.upsert(b"c", b"new", RecordType::Tombstone); // inserted between
        list.upsert(b"b", b"longer value", RecordType::Insert); // replaced
        list.upsert(b"a", b"", RecordType::Insert); // inserted first
        list.upsert(b"e", b"5", RecordType::Insert); // appended
        assert_eq!(list.search(b"c"), Ok(2));
        assert_eq!(list.search(b"bb"), Err(2));
        list.remove(3); // "d"
        let got: Vec<(&[u8], &[u8], RecordType)> = list.iter().collect();
        let want: Vec<(&[u8], &[u8], RecordType)> = vec![
            (b"a", b"", RecordType::Insert),
            (b"b", b"longer value", RecordType::Insert),
            (b"c", b"new", RecordType::Tombstone),
            (b"e", b"5", RecordType::Insert),
        ];
        assert_eq!(got, want);

        // A node's record goes in with its prefix and suffix joined.
        let mut buf = vec![0u8; 256];
        let mut node = NodeMut::init(&mut buf, NodeKind::Mini, Fences::Prefix(b"pre")).unwrap();
        node.push(b"pre-x", b"v", RecordType::Cache).unwrap();
        let mut from_node = RecordList::default();
        from_node.push_view(&node.as_ref().record(0), RecordType::Insert);
        assert_eq!(from_node.key(0), b"pre-x");
        assert_eq!(from_node.value(0), b"v");
        assert_eq!(from_node.record_type(0), RecordType::Insert);
        assert_eq!(from_node.len(), 1);
    }

    #[test]
    fn header_round_trips() {
        let h = MiniHeader {
            pid: PageId(0x0123_4567_89ab),
            leaf: PageNo((1 << 48) - 1),
            mirror: true,
            owner: (1 << 15) - 1,
        };
        let mut buf = [0u8; 16];
        h.write(&mut buf);
        assert_eq!(MiniHeader::read(&buf), h);
    }

    #[test]
    fn separators_are_shortest() {
        assert_eq!(separator(b"abc", b"abd"), b"abd");
        assert_eq!(separator(b"abc", b"b"), b"b");
        assert_eq!(separator(b"ab", b"abzzz"), b"abz");
        assert_eq!(separator(b"", b"\0"), b"\0");
    }

    #[test]
    fn packing_makes_no_page_more_than_it_needs() {
        // From just over one page of records to just under two: always two pages, each
        // about half of the records (a tail past the target once made a third, nearly
        // empty page on most splits, leaving leaf pages under half full).
        let one_page = (PAGE_PAYLOAD_SIZE - NODE_META_SIZE_BYTES) / record_cost(12, 20);
        for n in (one_page + 1)..(2 * one_page - 4) {
            let records: RecordList = (0..n as u32)
                .map(|i| (format!("key{i:09}").into_bytes(), vec![7u8; 20]))
                .collect();
            let chunks = pack_leaves(&records, None, None, Fill::Balanced, PAGE_PAYLOAD_SIZE);
            assert_eq!(chunks.len(), 2, "{n} records of {one_page} per page");
            let sizes: Vec<usize> = chunks.iter().map(|c| c.records.len()).collect();
            assert!(sizes.iter().all(|&k| k + 2 >= n / 2), "{n}: {sizes:?}");
            let mut payload = vec![0u8; PAGE_PAYLOAD_SIZE];
            for c in &chunks {
                build_leaf(&mut payload, c, &records).unwrap();
            }
        }
    }

    #[test]
    fn packing_full_fills_all_pages_but_one_end() {
        // Keys share "key00" within a page once the fences bound it, so a full page holds
        // more records than the full-key count `one_page`.
        let one_page = (PAGE_PAYLOAD_SIZE - NODE_META_SIZE_BYTES) / record_cost(12, 20);
        for n in [1, 2, one_page, one_page + 1, 2 * one_page + 7, 5 * one_page] {
            let records: RecordList = (0..n as u32)
                .map(|i| (format!("key{i:09}").into_bytes(), vec![7u8; 20]))
                .collect();
            for (fill, low, high) in [
                (Fill::Ascending, Some(&b"k"[..]), None),
                (Fill::Descending, None, Some(&b"l"[..])),
                (Fill::Ascending, Some(&b"key"[..]), Some(&b"kez"[..])),
            ] {
                let chunks = pack_leaves(&records, low, high, fill, PAGE_PAYLOAD_SIZE);
                check_chunks(&chunks, &records, low, high);
                // Every page but the one end's is full: about as many records as a page
                // holds at full key length, or more (its fences may give it a prefix); a
                // balanced split of n records would give n / pages.
                let full = match fill {
                    Fill::Descending => &chunks[1..],
                    _ => &chunks[..chunks.len() - 1],
                };
                for c in full {
                    assert!(
                        c.records.len() + 1 >= one_page,
                        "{fill:?} {n}: {:?}",
                        c.records
                    );
                }
            }
        }
    }

    #[test]
    fn packing_an_open_end_puts_a_boundary_past_it() {
        let one_page = (PAGE_PAYLOAD_SIZE - NODE_META_SIZE_BYTES) / record_cost(12, 20);
        let n = 3 * one_page;
        let records: RecordList = (0..n as u32)
            .map(|i| (format!("key{i:09}").into_bytes(), vec![7u8; 20]))
            .collect();
        let (low, high) = (Some(&b"k"[..]), None);
        // A stream ascending into the middle: a boundary right above the open record,
        // full pages below it, the records above on pages of their own.
        for open in [one_page / 2, one_page + 3, 2 * one_page - 1] {
            let (chunks, at) = pack_open(
                &records,
                low,
                high,
                Fill::Ascending,
                open,
                PAGE_PAYLOAD_SIZE,
            );
            check_chunks(&chunks, &records, low, high);
            // (Unless everything above fits in the open end's page.)
            let end = chunks[at].records.end;
            assert!(
                end == open + 1 || end == n,
                "{open}: boundary past it, not {end}"
            );
            assert!(chunks[at].records.contains(&open));
            for c in &chunks[..at] {
                assert!(c.records.len() + 1 >= one_page, "{open}: {:?}", c.records);
            }
        }
        // Descending: a boundary right below the open record, full pages above it.
        for open in [one_page / 2, one_page + 3, 2 * one_page - 1] {
            let (chunks, at) = pack_open(
                &records,
                low,
                high,
                Fill::Descending,
                open,
                PAGE_PAYLOAD_SIZE,
            );
            check_chunks(&chunks, &records, low, high);
            // (Unless everything below fits in the open end's page: at 1/2 a page.)
            let start = chunks[at].records.start;
            assert!(
                start == open || start == 0,
                "{open}: boundary below it, not {start}"
            );
            assert!(chunks[at].records.contains(&open));
            for c in &chunks[at + 1..] {
                assert!(c.records.len() + 1 >= one_page, "{open}: {:?}", c.records);
            }
        }
        // Where the far side is pages long, the boundary is exact.
        let (chunks, at) = pack_open(
            &records,
            low,
            high,
            Fill::Ascending,
            one_page / 2,
            PAGE_PAYLOAD_SIZE,
        );
        assert_eq!(chunks[at].records.end, one_page / 2 + 1);
        let (chunks, at) = pack_open(
            &records,
            low,
            high,
            Fill::Descending,
            2 * one_page,
            PAGE_PAYLOAD_SIZE,
        );
        assert_eq!(chunks[at].records.start, 2 * one_page);
        // A few records beyond the open end share its page instead of getting their own.
        let open = n - 3;
        let (chunks, at) = pack_open(
            &records,
            low,
            high,
            Fill::Ascending,
            open,
            PAGE_PAYLOAD_SIZE,
        );
        check_chunks(&chunks, &records, low, high);
        assert_eq!(
            at,
            chunks.len() - 1,
            "the open end's page takes the last 2 records"
        );
        let (chunks, at) = pack_open(&records, low, high, Fill::Descending, 2, PAGE_PAYLOAD_SIZE);
        check_chunks(&chunks, &records, low, high);
        assert_eq!(at, 0, "the open end's page takes the first 2 records");
        // At the very end it is a plain sorted-order packing.
        let (chunks, at) = pack_open(
            &records,
            low,
            high,
            Fill::Ascending,
            n - 1,
            PAGE_PAYLOAD_SIZE,
        );
        assert_eq!(at, chunks.len() - 1);
        let plain = pack_leaves(&records, low, high, Fill::Ascending, PAGE_PAYLOAD_SIZE);
        let ranges = |c: &[LeafChunk]| c.iter().map(|c| c.records.clone()).collect::<Vec<_>>();
        assert_eq!(ranges(&chunks), ranges(&plain));
    }

    #[test]
    fn packing_balances_and_fits() {
        let records: RecordList = (0..400u32)
            .map(|i| (format!("key{i:06}").into_bytes(), vec![7u8; 20]))
            .collect();
        let chunks = pack_leaves(&records, None, None, Fill::Balanced, PAGE_PAYLOAD_SIZE);
        assert!(chunks.len() >= 3, "400 * 37 bytes needs at least 3 pages");
        check_chunks(&chunks, &records, None, None);
    }

    /// The chunks cover the records in order, chain their fences from `low` to `high`,
    /// and each builds into a leaf page.
    fn check_chunks(
        chunks: &[LeafChunk],
        records: &RecordList,
        low: Option<&[u8]>,
        high: Option<&[u8]>,
    ) {
        assert_eq!(chunks.first().unwrap().low.as_deref(), low);
        assert_eq!(chunks.last().unwrap().high.as_deref(), high);
        assert_eq!(chunks.first().unwrap().records.start, 0);
        assert_eq!(chunks.last().unwrap().records.end, records.len());
        for w in chunks.windows(2) {
            assert_eq!(w[0].high, w[1].low);
            assert_eq!(w[0].records.end, w[1].records.start);
        }
        let mut payload = vec![0u8; PAGE_PAYLOAD_SIZE];
        for c in chunks {
            build_leaf(&mut payload, c, records).unwrap();
        }
    }
}
