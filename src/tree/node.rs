//! The one byte layout shared by mini-pages, leaf pages and inner nodes.
//!
//! A node is a caller-provided byte slice whose length is the node size (16 B .. 32 KiB):
//! a mini-page in the circular buffer (64 B .. 4 KiB), the 4080-byte payload of a 4 KiB
//! leaf page, or an inner node in memory whose values are 8-byte child references. This
//! module never allocates storage for a node; it only reads and writes the slice it is
//! given, with ordinary (bounds-checked) slice indexing and no `unsafe`.
//!
//! ```text
//! 0        16                         meta_end        data_start               node_size
//! | NodeMeta | KV meta 0 | KV meta 1 | ... | free space | key/value data (grows <-) |
//! ```
//!
//! The KV-meta array grows forward from byte 16, one 8-byte meta per record; key and
//! value bytes grow backward from the end. The node is full when they meet. Each record's
//! key bytes are followed directly by its value bytes. See `docs/design.md` (node part)
//! for the byte diagrams and the argument for each invariant.
//!
//! # Invariants this module owns
//!
//! - `16 + 8 * count <= data_start <= node_size`, and every record's bytes lie in
//!   `data_start..node_size`; no two records share a byte. (A record with an empty
//!   stored key and an empty value owns no bytes; its offset only has to be at most
//!   `node_size`.)
//! - `dead_bytes == (node_size - data_start) - (bytes referenced by the metas)`.
//! - Fence records come first (the low then the high fence key, or one prefix record);
//!   the node's prefix is stored once, inside them, and stripped from every other key.
//! - Records after the fence records are sorted by key, strictly increasing, and lie
//!   inside the fences (low inclusive, high exclusive) and under the prefix.
//! - Every meta's look-ahead field equals the first two bytes of its stored key,
//!   zero-padded, read as a big-endian `u16`.
//!
//! # Example
//!
//! ```
//! use bfdb::tree::node::{Fences, NodeKind, NodeMut, NodeRef, RecordType};
//!
//! let mut buf = [0u8; 256];
//! let fences = Fences::Range { low: Some(b"user:a"), high: Some(b"user:m") };
//! let mut node = NodeMut::init(&mut buf, NodeKind::Mini, fences)?;
//! node.insert(b"user:bob", b"42", RecordType::Insert).unwrap();
//! node.insert(b"user:alice", b"7", RecordType::Cache).unwrap();
//! assert!(node.insert(b"user:zed", b"", RecordType::Insert).is_err()); // past the high fence
//!
//! let view = NodeRef::parse(&buf)?; // as if the bytes came from disk
//! assert_eq!(view.prefix(), b"user:"); // stored once, not per key
//! assert_eq!(view.search(b"user:bob"), Ok(1));
//! assert_eq!(view.value(1), b"42");
//! assert_eq!(view.search(b"user:carol"), Err(2));
//! # Ok::<(), bfdb::tree::node::NodeError>(())
//! ```
//!
//! [`NodeRef::parse`] checks all of them, so a node decoded from disk can afterwards be
//! read without any access going out of bounds. Nodes built in memory by [`NodeMut`]
//! keep them by construction and are re-entered through the `trusted` constructors,
//! which check them only in debug builds.

use std::cmp::Ordering;
use std::fmt;

mod bulk;
mod validate;
mod write;

pub use bulk::{build_sorted, copy_into, split};
pub use write::NodeMut;

// ---------------------------------------------------------------------------------------
// Layout constants
// ---------------------------------------------------------------------------------------

/// Size of the node meta (the node header) in bytes.
///
/// The paper's node meta has 12 bytes; ours has 16 so that the KV-meta array that
/// follows it starts 8-byte aligned whenever the node itself is.
pub const NODE_META_SIZE_BYTES: usize = 16;
/// Size of one KV meta in bytes.
pub const KV_META_SIZE_BYTES: usize = 8;
/// The smallest node: just a node meta, room for nothing else.
pub const MIN_NODE_SIZE_BYTES: usize = NODE_META_SIZE_BYTES;
/// The largest node this layout can address (16-bit offsets and sizes).
pub const MAX_NODE_SIZE_BYTES: usize = 32 * 1024;
/// The longest stored key (suffix after the prefix, or a full fence key) in bytes.
pub const MAX_KEY_SUFFIX_BYTES: usize = (1 << KEY_LEN_BITS) - 1;
/// The longest value in bytes.
pub const MAX_VALUE_BYTES: usize = (1 << VALUE_LEN_BITS) - 1;

// Byte positions of the node meta's fields (all integers little-endian).
const NODE_SIZE_AT: usize = 0;
const KIND_AT: usize = 2;
const FLAGS_AT: usize = 3;
const COUNT_AT: usize = 4;
const DATA_START_AT: usize = 6;
const PREFIX_LEN_AT: usize = 8;
const DEAD_BYTES_AT: usize = 10;
const RESERVED_AT: usize = 12;
const RESERVED_LEN: usize = 4;

const _: () = assert!(RESERVED_AT + RESERVED_LEN == NODE_META_SIZE_BYTES);
const _: () = assert!(NODE_META_SIZE_BYTES.is_multiple_of(8));
const _: () = assert!(MAX_NODE_SIZE_BYTES <= u16::MAX as usize);

// Bits of the node meta's flags byte.
/// The split/full flag: set by the tree when the node should be split or merged.
const FLAG_FULL: u8 = 1 << 0;
/// The first two metas are the low and high fence records.
const FLAG_HAS_FENCES: u8 = 1 << 1;
/// The first meta is a record holding the node's prefix.
const FLAG_HAS_PREFIX_RECORD: u8 = 1 << 2;
const FLAGS_KNOWN: u8 = FLAG_FULL | FLAG_HAS_FENCES | FLAG_HAS_PREFIX_RECORD;

// Bit positions of the fields of a KV meta (one little-endian u64).
const OFFSET_SHIFT: u32 = 0;
const OFFSET_BITS: u32 = 16;
const KEY_LEN_SHIFT: u32 = 16;
const KEY_LEN_BITS: u32 = 13;
/// Set on a record whose value bytes are a reference to a value kept out of line.
const EXTERNAL_SHIFT: u32 = 29;
const VALUE_LEN_SHIFT: u32 = 30;
const VALUE_LEN_BITS: u32 = 14;
const TYPE_SHIFT: u32 = 44;
const TYPE_BITS: u32 = 2;
const FENCE_SHIFT: u32 = 46;
const REF_SHIFT: u32 = 47;
const LOOK_AHEAD_SHIFT: u32 = 48;
const LOOK_AHEAD_BITS: u32 = 16;

const _: () = assert!(OFFSET_SHIFT + OFFSET_BITS == KEY_LEN_SHIFT);
const _: () = assert!(KEY_LEN_SHIFT + KEY_LEN_BITS == EXTERNAL_SHIFT);
const _: () = assert!(EXTERNAL_SHIFT + 1 == VALUE_LEN_SHIFT);
const _: () = assert!(VALUE_LEN_SHIFT + VALUE_LEN_BITS == TYPE_SHIFT);
const _: () = assert!(TYPE_SHIFT + TYPE_BITS == FENCE_SHIFT);
const _: () = assert!(FENCE_SHIFT + 1 == REF_SHIFT);
const _: () = assert!(REF_SHIFT + 1 == LOOK_AHEAD_SHIFT);
const _: () = assert!(LOOK_AHEAD_SHIFT + LOOK_AHEAD_BITS == 64);
const _: () = assert!(size_of::<KvMeta>() == KV_META_SIZE_BYTES);
const _: () = assert!(MAX_NODE_SIZE_BYTES < (1 << OFFSET_BITS));

// Fence records reuse the record-type bits for their role and the reference bit for
// "unbounded"; neither has a meaning of its own on a fence record.
const FENCE_ROLE_LOW: u8 = 0;
const FENCE_ROLE_HIGH: u8 = 1;
const FENCE_ROLE_PREFIX: u8 = 2;

// ---------------------------------------------------------------------------------------
// Small public types
// ---------------------------------------------------------------------------------------

/// What a node is used as. Stored in byte 2 of the node meta.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeKind {
    /// The payload of a leaf page on disk.
    Leaf,
    /// A mini-page in the circular buffer.
    Mini,
    /// An inner node; its values are 8-byte child references.
    Inner,
}

impl NodeKind {
    fn to_byte(self) -> u8 {
        match self {
            NodeKind::Leaf => 0,
            NodeKind::Mini => 1,
            NodeKind::Inner => 2,
        }
    }

    fn from_byte(b: u8) -> Option<NodeKind> {
        match b {
            0 => Some(NodeKind::Leaf),
            1 => Some(NodeKind::Mini),
            2 => Some(NodeKind::Inner),
            _ => None,
        }
    }
}

/// The four record types of the paper's Table 1, and for the two that hold a value,
/// whether the value is stored inline or out of line (`*External`: the record's value
/// bytes are a reference to a value in the database's value store).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordType {
    /// A write not yet on the leaf page: dirty, the key exists.
    Insert,
    /// A clean copy of a leaf page record: the key exists.
    Cache,
    /// A delete not yet on the leaf page: dirty, the key does not exist.
    Tombstone,
    /// A cached negative lookup: clean, the key does not exist.
    Phantom,
    /// An `Insert` whose value is kept out of line.
    InsertExternal,
    /// A `Cache` record whose value is kept out of line.
    CacheExternal,
}

impl RecordType {
    /// Whether the record must be written back to the leaf page on merge.
    pub fn is_dirty(self) -> bool {
        matches!(
            self,
            RecordType::Insert | RecordType::InsertExternal | RecordType::Tombstone
        )
    }

    /// Whether the record says the key exists.
    pub fn exists(self) -> bool {
        matches!(
            self,
            RecordType::Insert
                | RecordType::Cache
                | RecordType::InsertExternal
                | RecordType::CacheExternal
        )
    }

    /// Whether the record's value bytes are a reference to a value kept out of line.
    pub fn is_external(self) -> bool {
        matches!(self, RecordType::InsertExternal | RecordType::CacheExternal)
    }

    /// The dirty type of the same form: `Insert` or `InsertExternal` for a record whose
    /// key exists, `Tombstone` otherwise. A leaf page's records, which are all dirty
    /// with respect to a mini-page, are written with it.
    pub fn dirty(self) -> RecordType {
        match self {
            RecordType::Insert | RecordType::Cache => RecordType::Insert,
            RecordType::InsertExternal | RecordType::CacheExternal => RecordType::InsertExternal,
            RecordType::Tombstone | RecordType::Phantom => RecordType::Tombstone,
        }
    }

    /// The clean type of the same form: `Cache` or `CacheExternal` for a record whose
    /// key exists, `Phantom` otherwise.
    pub fn clean(self) -> RecordType {
        match self {
            RecordType::Insert | RecordType::Cache => RecordType::Cache,
            RecordType::InsertExternal | RecordType::CacheExternal => RecordType::CacheExternal,
            RecordType::Tombstone | RecordType::Phantom => RecordType::Phantom,
        }
    }

    /// The two type bits of the KV meta.
    fn to_bits(self) -> u8 {
        match self {
            RecordType::Insert | RecordType::InsertExternal => 0,
            RecordType::Cache | RecordType::CacheExternal => 1,
            RecordType::Tombstone => 2,
            RecordType::Phantom => 3,
        }
    }

    fn from_bits(b: u8, external: bool) -> RecordType {
        match (b & 0b11, external) {
            (0, false) => RecordType::Insert,
            (1, false) => RecordType::Cache,
            (0, true) => RecordType::InsertExternal,
            (1, true) => RecordType::CacheExternal,
            (2, _) => RecordType::Tombstone,
            _ => RecordType::Phantom,
        }
    }
}

/// How a node records the key range it covers. Chosen at [`NodeMut::init`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fences<'k> {
    /// No fence records and no prefix: the cheapest choice for tiny mini-pages.
    None,
    /// One fence record holding the prefix every key in the node shares. A mini-page can
    /// carry its leaf page's prefix this way without the full fence keys.
    Prefix(&'k [u8]),
    /// Low and high fence keys, stored in full; `None` means unbounded (-∞ or +∞).
    /// Keys `k` with `low <= k < high` belong to the node; the prefix is the common
    /// prefix of two bounded fences, empty if either is unbounded.
    Range {
        /// Inclusive lower bound, `None` for -∞.
        low: Option<&'k [u8]>,
        /// Exclusive upper bound, `None` for +∞.
        high: Option<&'k [u8]>,
    },
}

impl Fences<'_> {
    fn fence_count(&self) -> usize {
        match self {
            Fences::None => 0,
            Fences::Prefix(_) => 1,
            Fences::Range { .. } => 2,
        }
    }

    /// Bytes the fence records of this choice take in a node (metas and key bytes).
    pub fn size_bytes(&self) -> usize {
        match self {
            Fences::None => 0,
            Fences::Prefix(p) => KV_META_SIZE_BYTES + p.len(),
            Fences::Range { low, high } => {
                2 * KV_META_SIZE_BYTES + low.map_or(0, <[u8]>::len) + high.map_or(0, <[u8]>::len)
            }
        }
    }

    /// The prefix every key of a node with these fences carries.
    pub fn prefix(&self) -> &[u8] {
        match *self {
            Fences::None => &[],
            Fences::Prefix(p) => p,
            Fences::Range {
                low: Some(l),
                high: Some(h),
            } => &l[..common_prefix_len(l, h)],
            Fences::Range { .. } => &[],
        }
    }

    /// Whether `key` belongs to a node with these fences.
    pub fn covers(&self, key: &[u8]) -> bool {
        match *self {
            Fences::None => true,
            Fences::Prefix(p) => {
                key.len() >= p.len() && cmp_keys(&key[..p.len()], p) == Ordering::Equal
            }
            Fences::Range { low, high } => {
                low.is_none_or(|l| cmp_keys(key, l) != Ordering::Less)
                    && high.is_none_or(|h| cmp_keys(key, h) == Ordering::Less)
            }
        }
    }
}

/// One fence key of a node with [`Fences::Range`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence<'a> {
    /// -∞ for a low fence, +∞ for a high fence.
    Unbounded,
    /// A bounded fence key, in full.
    Key(&'a [u8]),
}

impl<'a> Fence<'a> {
    /// The key, or `None` if unbounded.
    pub fn key(self) -> Option<&'a [u8]> {
        match self {
            Fence::Unbounded => None,
            Fence::Key(k) => Some(k),
        }
    }
}

/// The bytes of a node do not form a valid node (or, for [`NodeMut::init`], the node
/// could not be created as asked). Carries a description of the first problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeError {
    reason: String,
}

impl NodeError {
    fn new(reason: impl Into<String>) -> NodeError {
        NodeError {
            reason: reason.into(),
        }
    }

    /// What was wrong.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid node: {}", self.reason)
    }
}

impl std::error::Error for NodeError {}

/// Why a write to a node was refused. The node is unchanged when one is returned.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteError {
    /// The record does not fit, even after compaction.
    Full,
    /// The key lies outside the node's fences or does not carry its prefix.
    OutOfRange,
    /// The stored key or the value is longer than a KV meta can describe.
    TooLarge,
    /// [`NodeMut::insert`] was given a key the node already holds, at this index.
    KeyExists(usize),
    /// A bulk helper could not initialise the destination node.
    Init(NodeError),
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteError::Full => write!(f, "node is full"),
            WriteError::OutOfRange => write!(f, "key lies outside the node's key range"),
            WriteError::TooLarge => write!(
                f,
                "stored key or value exceeds {MAX_KEY_SUFFIX_BYTES} / {MAX_VALUE_BYTES} bytes"
            ),
            WriteError::KeyExists(i) => write!(f, "key already present at index {i}"),
            WriteError::Init(e) => write!(f, "cannot initialise node: {e}"),
        }
    }
}

impl std::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WriteError::Init(e) => Some(e),
            _ => None,
        }
    }
}

/// What [`NodeMut::upsert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upserted {
    /// The key was new; the record now sits at this index.
    Inserted(usize),
    /// The key was present at this index; its value and type were replaced.
    Updated(usize),
}

impl Upserted {
    /// The record's index either way.
    pub fn index(self) -> usize {
        match self {
            Upserted::Inserted(i) | Upserted::Updated(i) => i,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Byte helpers
// ---------------------------------------------------------------------------------------

fn get_u16(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([buf[at], buf[at + 1]])
}

fn put_u16(buf: &mut [u8], at: usize, v: u16) {
    buf[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

/// Byte position of KV meta number `m` (fence records included).
fn meta_pos(m: usize) -> usize {
    NODE_META_SIZE_BYTES + m * KV_META_SIZE_BYTES
}

#[inline]
fn get_meta(buf: &[u8], m: usize) -> KvMeta {
    let at = meta_pos(m);
    let mut b = [0u8; KV_META_SIZE_BYTES];
    b.copy_from_slice(&buf[at..at + KV_META_SIZE_BYTES]);
    KvMeta(u64::from_le_bytes(b))
}

fn put_meta(buf: &mut [u8], m: usize, meta: KvMeta) {
    let at = meta_pos(m);
    buf[at..at + KV_META_SIZE_BYTES].copy_from_slice(&meta.0.to_le_bytes());
}

/// The look-ahead of a stored key: its first two bytes, zero-padded, big-endian.
///
/// Zero padding keeps the order: if the look-aheads of `a` and `b` differ, then `a < b`
/// exactly when `look_ahead(a) < look_ahead(b)` (argument in the design document); only
/// equal look-aheads need the full key compared.
pub fn look_ahead(stored_key: &[u8]) -> u16 {
    let b0 = stored_key.first().copied().unwrap_or(0);
    let b1 = stored_key.get(1).copied().unwrap_or(0);
    u16::from_be_bytes([b0, b1])
}

/// Length of the longest common prefix of `a` and `b`.
pub fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Compares two byte strings as `<[u8]>::cmp` does, faster for the short keys nodes hold.
///
/// Most stored keys are a few dozen bytes after prefix compression; comparing them eight
/// bytes at a time as big-endian words avoids the call into the C library's `memcmp` that
/// dominated profiles of searches. Longer keys still go to `memcmp`, which wins there.
#[inline]
pub fn cmp_keys(a: &[u8], b: &[u8]) -> Ordering {
    const INLINE_MAX_BYTES: usize = 32;
    let n = a.len().min(b.len());
    if n > INLINE_MAX_BYTES {
        return a.cmp(b);
    }
    let (mut a_rest, mut b_rest) = (&a[..n], &b[..n]);
    while let (Some((wa, ta)), Some((wb, tb))) = (
        a_rest.split_first_chunk::<8>(),
        b_rest.split_first_chunk::<8>(),
    ) {
        let (x, y) = (u64::from_be_bytes(*wa), u64::from_be_bytes(*wb));
        if x != y {
            return x.cmp(&y);
        }
        (a_rest, b_rest) = (ta, tb);
    }
    for (x, y) in a_rest.iter().zip(b_rest) {
        if x != y {
            return x.cmp(y);
        }
    }
    a.len().cmp(&b.len())
}

/// Compares the concatenation `prefix ++ suffix` with `key` without building it.
fn cmp_concat(prefix: &[u8], suffix: &[u8], key: &[u8]) -> Ordering {
    let n = prefix.len().min(key.len());
    match cmp_keys(&prefix[..n], &key[..n]) {
        Ordering::Equal if prefix.len() > key.len() => Ordering::Greater,
        Ordering::Equal => cmp_keys(suffix, &key[prefix.len()..]),
        o => o,
    }
}

// ---------------------------------------------------------------------------------------
// KV meta
// ---------------------------------------------------------------------------------------

/// One decoded KV meta. Private: callers see records through [`RecordView`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KvMeta(u64);

impl KvMeta {
    fn field(self, shift: u32, bits: u32) -> u64 {
        (self.0 >> shift) & ((1u64 << bits) - 1)
    }

    fn with_field(self, shift: u32, bits: u32, v: u64) -> KvMeta {
        debug_assert!(v < (1u64 << bits), "field value {v} overflows {bits} bits");
        let mask = ((1u64 << bits) - 1) << shift;
        KvMeta((self.0 & !mask) | (v << shift))
    }

    fn new(offset: usize, key: &[u8], value_len: usize, t: RecordType) -> KvMeta {
        debug_assert!(key.len() <= MAX_KEY_SUFFIX_BYTES && value_len <= MAX_VALUE_BYTES);
        KvMeta(0)
            .with_field(OFFSET_SHIFT, OFFSET_BITS, offset as u64)
            .with_field(KEY_LEN_SHIFT, KEY_LEN_BITS, key.len() as u64)
            .with_field(VALUE_LEN_SHIFT, VALUE_LEN_BITS, value_len as u64)
            .with_type(t)
            .with_field(
                LOOK_AHEAD_SHIFT,
                LOOK_AHEAD_BITS,
                u64::from(look_ahead(key)),
            )
    }

    fn new_fence(offset: usize, key: Option<&[u8]>, role: u8) -> KvMeta {
        let k = key.unwrap_or(&[]);
        KvMeta(0)
            .with_field(OFFSET_SHIFT, OFFSET_BITS, offset as u64)
            .with_field(KEY_LEN_SHIFT, KEY_LEN_BITS, k.len() as u64)
            .with_field(TYPE_SHIFT, TYPE_BITS, u64::from(role))
            .with_field(FENCE_SHIFT, 1, 1)
            .with_field(REF_SHIFT, 1, u64::from(key.is_none()))
            .with_field(LOOK_AHEAD_SHIFT, LOOK_AHEAD_BITS, u64::from(look_ahead(k)))
    }

    /// The meta with record type `t` (its type bits and external flag).
    fn with_type(self, t: RecordType) -> KvMeta {
        self.with_field(TYPE_SHIFT, TYPE_BITS, u64::from(t.to_bits()))
            .with_field(EXTERNAL_SHIFT, 1, u64::from(t.is_external()))
    }

    fn offset(self) -> usize {
        self.field(OFFSET_SHIFT, OFFSET_BITS) as usize
    }
    fn key_len(self) -> usize {
        self.field(KEY_LEN_SHIFT, KEY_LEN_BITS) as usize
    }
    fn value_len(self) -> usize {
        self.field(VALUE_LEN_SHIFT, VALUE_LEN_BITS) as usize
    }
    fn data_len(self) -> usize {
        self.key_len() + self.value_len()
    }
    fn type_bits(self) -> u8 {
        self.field(TYPE_SHIFT, TYPE_BITS) as u8
    }
    fn is_external(self) -> bool {
        self.field(EXTERNAL_SHIFT, 1) != 0
    }
    fn record_type(self) -> RecordType {
        RecordType::from_bits(self.type_bits(), self.is_external())
    }
    fn is_fence(self) -> bool {
        self.field(FENCE_SHIFT, 1) != 0
    }
    fn ref_bit(self) -> bool {
        self.field(REF_SHIFT, 1) != 0
    }
    fn look_ahead(self) -> u16 {
        self.field(LOOK_AHEAD_SHIFT, LOOK_AHEAD_BITS) as u16
    }
    fn key_range(self) -> std::ops::Range<usize> {
        self.offset()..self.offset() + self.key_len()
    }
    fn value_range(self) -> std::ops::Range<usize> {
        let v = self.offset() + self.key_len();
        v..v + self.value_len()
    }
}

// ---------------------------------------------------------------------------------------
// Read view
// ---------------------------------------------------------------------------------------

/// A read view over the bytes of a valid node.
///
/// Obtained from [`NodeRef::parse`] (bytes of unknown origin, fully validated) or
/// [`NodeRef::trusted`] (bytes this process built). Record indices count only the
/// records after the fence records: `0..len()`.
#[derive(Clone, Copy)]
pub struct NodeRef<'a> {
    buf: &'a [u8],
    /// Number of KV metas, fence records included.
    count: usize,
    /// Number of fence records (0, 1 or 2); record `i` is meta `first + i`.
    first: usize,
    /// Where the prefix bytes are stored (inside the first fence record).
    prefix_at: usize,
    prefix_len: usize,
}

impl fmt::Debug for NodeRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeRef")
            .field("kind", &self.kind())
            .field("node_size_bytes", &self.node_size_bytes())
            .field("len", &self.len())
            .field("prefix", &self.prefix())
            .field("free_space_bytes", &self.free_space_bytes())
            .field("dead_bytes", &self.dead_bytes())
            .finish()
    }
}

impl<'a> NodeRef<'a> {
    /// Validates `buf` as a node and returns a view over it.
    ///
    /// Checks everything a later access relies on: the node size equals `buf.len()`,
    /// the kind and flags are known, every offset and length is in bounds, the metas and
    /// the data region are disjoint, no two records share a byte, `dead_bytes` adds up,
    /// keys strictly increase, fences and prefix are consistent, the keys lie inside
    /// them, and every look-ahead matches its key. After `Ok`, no method of the view
    /// can panic on these bytes.
    pub fn parse(buf: &'a [u8]) -> Result<NodeRef<'a>, NodeError> {
        validate::validate(buf)?;
        Ok(NodeRef::from_header(buf))
    }

    /// A view over bytes this process built and kept valid (an in-memory node).
    ///
    /// Validated only in debug builds; giving it bytes that do not form a valid node is
    /// a bug and may panic.
    pub fn trusted(buf: &'a [u8]) -> NodeRef<'a> {
        debug_assert!(
            validate::validate(buf).is_ok(),
            "trusted node is invalid: {:?}",
            validate::validate(buf)
        );
        NodeRef::from_header(buf)
    }

    /// Decodes the header fields the view caches. The bytes must be valid.
    fn from_header(buf: &'a [u8]) -> NodeRef<'a> {
        let flags = buf[FLAGS_AT];
        let first = if flags & FLAG_HAS_FENCES != 0 {
            2
        } else if flags & FLAG_HAS_PREFIX_RECORD != 0 {
            1
        } else {
            0
        };
        let prefix_len = usize::from(get_u16(buf, PREFIX_LEN_AT));
        // Both the low fence key and the prefix record start with the prefix.
        let prefix_at = if first > 0 {
            get_meta(buf, 0).offset()
        } else {
            0
        };
        NodeRef {
            buf,
            count: usize::from(get_u16(buf, COUNT_AT)),
            first,
            prefix_at,
            prefix_len,
        }
    }

    /// The node's bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.buf
    }

    /// What the node is used as.
    pub fn kind(&self) -> NodeKind {
        NodeKind::from_byte(self.buf[KIND_AT]).unwrap_or(NodeKind::Mini)
    }

    /// Number of records, fence records excluded.
    pub fn len(&self) -> usize {
        self.count - self.first
    }

    /// Whether the node holds no records (fence records aside).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The node size: the length of its byte slice.
    pub fn node_size_bytes(&self) -> usize {
        self.buf.len()
    }

    fn data_start(&self) -> usize {
        usize::from(get_u16(self.buf, DATA_START_AT))
    }

    /// Contiguous free bytes between the KV-meta array and the key/value data.
    pub fn free_space_bytes(&self) -> usize {
        self.data_start() - meta_pos(self.count)
    }

    /// Data bytes no longer referenced by any record; [`NodeMut::compact`] reclaims them.
    pub fn dead_bytes(&self) -> usize {
        usize::from(get_u16(self.buf, DEAD_BYTES_AT))
    }

    /// Bytes a record could still take if the node were compacted.
    pub fn reclaimable_space_bytes(&self) -> usize {
        self.free_space_bytes() + self.dead_bytes()
    }

    /// The split/full flag.
    pub fn is_full(&self) -> bool {
        self.buf[FLAGS_AT] & FLAG_FULL != 0
    }

    /// The prefix every key in the node carries; it is stored once, not per key.
    pub fn prefix(&self) -> &'a [u8] {
        &self.buf[self.prefix_at..self.prefix_at + self.prefix_len]
    }

    fn fence(&self, m: usize) -> Fence<'a> {
        let meta = get_meta(self.buf, m);
        if meta.ref_bit() {
            Fence::Unbounded
        } else {
            Fence::Key(&self.buf[meta.key_range()])
        }
    }

    /// The low fence (inclusive), or `None` if the node has no fence keys.
    pub fn low_fence(&self) -> Option<Fence<'a>> {
        (self.first == 2).then(|| self.fence(0))
    }

    /// The high fence (exclusive), or `None` if the node has no fence keys.
    pub fn high_fence(&self) -> Option<Fence<'a>> {
        (self.first == 2).then(|| self.fence(1))
    }

    /// The fences the node was initialised with; pass them to a bulk helper to rebuild
    /// a node covering the same range.
    pub fn fences(&self) -> Fences<'a> {
        match self.first {
            2 => Fences::Range {
                low: self.fence(0).key(),
                high: self.fence(1).key(),
            },
            1 => Fences::Prefix(self.prefix()),
            _ => Fences::None,
        }
    }

    /// Whether `key` belongs to this node (inside its fences, under its prefix).
    pub fn covers(&self, key: &[u8]) -> bool {
        self.fences().covers(key)
    }

    fn meta(&self, i: usize) -> KvMeta {
        assert!(
            i < self.len(),
            "record index {i} out of range 0..{}",
            self.len()
        );
        get_meta(self.buf, self.first + i)
    }

    /// Binary search for the full `key`, like `slice::binary_search` over the records:
    /// `Ok(i)` if record `i` holds it, else `Err(i)` where it would be inserted.
    ///
    /// The look-ahead bytes in the KV metas are compared first; a record's key bytes are
    /// loaded only on a tie. A key without the node's prefix sorts before or after every
    /// record, and the answer says so (`Err(0)` or `Err(len)`).
    pub fn search(&self, key: &[u8]) -> Result<usize, usize> {
        let prefix = self.prefix();
        // `starts_with` and `<` would each call `memcmp`; one inline comparison of the
        // key's first bytes with the prefix answers both.
        let head = &key[..key.len().min(prefix.len())];
        match cmp_keys(head, prefix) {
            Ordering::Less => return Err(0),
            Ordering::Greater => return Err(self.len()),
            Ordering::Equal if head.len() < prefix.len() => return Err(0),
            Ordering::Equal => {}
        }
        let suffix = &key[prefix.len()..];
        let la = look_ahead(suffix);
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let meta = get_meta(self.buf, self.first + mid);
            let ord = match meta.look_ahead().cmp(&la) {
                Ordering::Equal => cmp_keys(&self.buf[meta.key_range()], suffix),
                o => o,
            };
            match ord {
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
                Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    /// The stored key of record `i`: its key without the node's prefix.
    pub fn key_suffix(&self, i: usize) -> &'a [u8] {
        &self.buf[self.meta(i).key_range()]
    }

    /// Writes the full key of record `i` (prefix and suffix) into `out`, replacing its
    /// contents.
    pub fn key_into(&self, i: usize, out: &mut Vec<u8>) {
        self.record(i).key_into(out);
    }

    /// The value of record `i`.
    pub fn value(&self, i: usize) -> &'a [u8] {
        &self.buf[self.meta(i).value_range()]
    }

    /// The type of record `i`.
    pub fn record_type(&self, i: usize) -> RecordType {
        self.meta(i).record_type()
    }

    /// The reference bit of record `i`.
    pub fn ref_bit(&self, i: usize) -> bool {
        self.meta(i).ref_bit()
    }

    /// Record `i`.
    pub fn record(&self, i: usize) -> RecordView<'a> {
        let meta = self.meta(i);
        RecordView {
            prefix: self.prefix(),
            suffix: &self.buf[meta.key_range()],
            value: &self.buf[meta.value_range()],
            meta,
        }
    }

    /// The records in key order.
    pub fn iter(&self) -> Records<'a> {
        self.iter_from(0)
    }

    /// The records in key order, starting at index `start` (clamped to `len()`); pair it
    /// with [`NodeRef::search`] to start a scan at a key.
    pub fn iter_from(&self, start: usize) -> Records<'a> {
        Records {
            node: *self,
            front: start.min(self.len()),
            back: self.len(),
        }
    }

    /// Bytes a new record with a full key of `key_len` bytes (prefix included) and a
    /// value of `value_len` bytes takes in this node: its KV meta plus its data.
    pub fn space_needed(&self, key_len: usize, value_len: usize) -> usize {
        debug_assert!(
            key_len >= self.prefix_len,
            "key shorter than the node's prefix"
        );
        KV_META_SIZE_BYTES + key_len.saturating_sub(self.prefix_len) + value_len
    }

    /// Bytes the fence records and the node meta take.
    fn fixed_bytes(&self) -> usize {
        let mut n = meta_pos(self.first);
        for m in 0..self.first {
            n += get_meta(self.buf, m).data_len();
        }
        n
    }

    /// Bytes the records (not fence records) take: metas plus data.
    pub fn records_size_bytes(&self) -> usize {
        self.node_size_bytes() - self.free_space_bytes() - self.dead_bytes() - self.fixed_bytes()
    }
}

/// One record of a node, borrowed from its bytes.
#[derive(Clone, Copy)]
pub struct RecordView<'a> {
    prefix: &'a [u8],
    suffix: &'a [u8],
    value: &'a [u8],
    meta: KvMeta,
}

impl fmt::Debug for RecordView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordView")
            .field("prefix", &self.prefix)
            .field("suffix", &self.suffix)
            .field("value", &self.value)
            .field("record_type", &self.record_type())
            .field("ref_bit", &self.ref_bit())
            .finish()
    }
}

impl<'a> RecordView<'a> {
    /// The node's prefix, the first part of the full key.
    pub fn prefix(&self) -> &'a [u8] {
        self.prefix
    }

    /// The stored key suffix, the second part of the full key.
    pub fn suffix(&self) -> &'a [u8] {
        self.suffix
    }

    /// The value.
    pub fn value(&self) -> &'a [u8] {
        self.value
    }

    /// The record type.
    pub fn record_type(&self) -> RecordType {
        self.meta.record_type()
    }

    /// The reference bit (set when the record was accessed).
    pub fn ref_bit(&self) -> bool {
        self.meta.ref_bit()
    }

    /// Length of the full key.
    pub fn key_len(&self) -> usize {
        self.prefix.len() + self.suffix.len()
    }

    /// Writes the full key into `out`, replacing its contents; reuse `out` across
    /// records to avoid allocating per record.
    pub fn key_into(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(self.prefix);
        out.extend_from_slice(self.suffix);
    }

    /// Appends the full key (prefix and suffix) to `out`, keeping what it holds.
    pub fn append_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.prefix);
        out.extend_from_slice(self.suffix);
    }

    /// The full key in a new vector.
    pub fn key(&self) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.key_len());
        self.key_into(&mut k);
        k
    }

    /// Compares the record's full key with `key` without assembling it.
    pub fn cmp_key(&self, key: &[u8]) -> Ordering {
        cmp_concat(self.prefix, self.suffix, key)
    }
}

/// Iterator over a node's records in key order.
#[derive(Clone)]
pub struct Records<'a> {
    node: NodeRef<'a>,
    front: usize,
    back: usize,
}

impl<'a> Iterator for Records<'a> {
    type Item = RecordView<'a>;

    fn next(&mut self) -> Option<RecordView<'a>> {
        if self.front == self.back {
            return None;
        }
        self.front += 1;
        Some(self.node.record(self.front - 1))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.front;
        (n, Some(n))
    }

    fn nth(&mut self, n: usize) -> Option<RecordView<'a>> {
        self.front = self.front.saturating_add(n).min(self.back);
        self.next()
    }
}

impl DoubleEndedIterator for Records<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.front == self.back {
            return None;
        }
        self.back -= 1;
        Some(self.node.record(self.back))
    }
}

impl ExactSizeIterator for Records<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmp_keys_agrees_with_slice_order() {
        // Every pair from a set built to hit each path: equal words, a difference in
        // the first word, in a later word, in the tail, one key a prefix of the other,
        // empty keys, 0x00/0xff bytes (signedness), and keys past the inline limit.
        let mut keys: Vec<Vec<u8>> = vec![Vec::new(), vec![0], vec![0xff], vec![0x80]];
        for len in [1usize, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 64] {
            let base: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            keys.push(base.clone());
            for at in [0, len / 2, len - 1] {
                for delta in [1u8, 0x7f, 0x80] {
                    let mut k = base.clone();
                    k[at] = k[at].wrapping_add(delta);
                    keys.push(k);
                }
            }
            keys.push(base[..len - 1].to_vec());
        }
        for a in &keys {
            for b in &keys {
                assert_eq!(cmp_keys(a, b), a.cmp(b), "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn look_ahead_orders_unequal_values_like_the_keys() {
        let keys: [&[u8]; 10] = [
            b"",
            b"\0",
            b"\0\0",
            b"\0\x01",
            b"a",
            b"a\0",
            b"a\0\0",
            b"ab",
            b"b",
            b"\xff\xff\xff",
        ];
        for a in keys {
            for b in keys {
                let (la, lb) = (look_ahead(a), look_ahead(b));
                if la != lb {
                    assert_eq!(la.cmp(&lb), a.cmp(b), "{a:?} vs {b:?}");
                }
            }
        }
        // Ties the full comparison must break.
        assert_eq!(look_ahead(b"a"), look_ahead(b"a\0"));
        assert_eq!(look_ahead(b""), look_ahead(b"\0\0\x05"));
    }

    #[test]
    fn cmp_concat_matches_concatenation() {
        let parts: [&[u8]; 5] = [b"", b"a", b"ab", b"abc", b"b"];
        for p in parts {
            for s in parts {
                for k in parts {
                    let full = [p, s].concat();
                    assert_eq!(
                        cmp_concat(p, s, k),
                        full.as_slice().cmp(k),
                        "{p:?} {s:?} {k:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn kv_meta_fields_round_trip() {
        let m = KvMeta::new(
            32767,
            &[0xff; MAX_KEY_SUFFIX_BYTES],
            MAX_VALUE_BYTES,
            RecordType::Phantom,
        )
        .with_field(REF_SHIFT, 1, 1);
        assert_eq!(m.offset(), 32767);
        assert_eq!(m.key_len(), MAX_KEY_SUFFIX_BYTES);
        assert_eq!(m.value_len(), MAX_VALUE_BYTES);
        assert_eq!(m.record_type(), RecordType::Phantom);
        assert!(m.ref_bit());
        assert!(!m.is_fence());
        assert_eq!(m.look_ahead(), 0xffff);
    }

    #[test]
    fn init_writes_documented_header_bytes() {
        let mut buf = [0xaau8; 64];
        NodeMut::init(
            &mut buf,
            NodeKind::Leaf,
            Fences::Range {
                low: Some(b"abc"),
                high: Some(b"abd"),
            },
        )
        .unwrap();
        assert_eq!(&buf[0..2], &64u16.to_le_bytes());
        assert_eq!(buf[2], 0);
        assert_eq!(buf[3], FLAG_HAS_FENCES);
        assert_eq!(&buf[4..6], &2u16.to_le_bytes());
        assert_eq!(&buf[6..8], &58u16.to_le_bytes());
        assert_eq!(&buf[8..10], &2u16.to_le_bytes());
        assert_eq!(&buf[10..16], &[0; 6]);
        assert_eq!(&buf[58..64], b"abdabc");
        let low = get_meta(&buf, 0);
        assert_eq!((low.offset(), low.key_len(), low.is_fence()), (61, 3, true));
        assert_eq!(NodeRef::parse(&buf).unwrap().prefix(), b"ab");
    }
}
