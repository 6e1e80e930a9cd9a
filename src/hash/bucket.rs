//! The hot index's memory layout: key hashes, 8-byte entries, 64-byte buckets, the
//! overflow-bucket allocator and one table (an array of buckets plus its overflow
//! buckets). No protocol lives here; `index.rs` owns insert, find and growth.
//!
//! # Entry (one `u64`, 0 = empty slot)
//!
//! ```text
//!  63 62            48 47                                             0
//! ┌──┬────────────────┬────────────────────────────────────────────────┐
//! │T │ tag (15 bits)  │ address (48 bits)                              │
//! └──┴────────────────┴────────────────────────────────────────────────┘
//!  T = tentative: set while a two-phase insert has not yet checked for a duplicate tag
//! ```
//!
//! Tags are never 0 (see [`KeyHash::tag`]), so a live entry is never the empty word, even
//! with address 0 (an entry created before its first record is linked).
//!
//! # Bucket (64 bytes, 64-byte aligned)
//!
//! ```text
//! ┌────────┬────────┬────────┬────────┬────────┬────────┬────────┬──────────┐
//! │entry 0 │entry 1 │entry 2 │entry 3 │entry 4 │entry 5 │entry 6 │ overflow │
//! └────────┴────────┴────────┴────────┴────────┴────────┴────────┴──────────┘
//!  overflow: 0, or 1 + the index of the next bucket in the table's overflow allocator
//! ```
//!
//! Invariants: a table's length is a power of two; a bucket's overflow word goes from 0
//! to non-zero once and never changes again while the table lives; overflow buckets are
//! freed only with their table.

use std::sync::OnceLock;

use crate::sync::Mutex;
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Bits of a record address kept in an entry.
pub(crate) const ADDRESS_BITS: u32 = 48;
/// The largest address an entry can hold.
pub(crate) const MAX_ADDRESS: u64 = (1 << ADDRESS_BITS) - 1;
/// The address of no record: the end of a chain, or an entry whose first record is not
/// linked yet.
pub(crate) const INVALID_ADDRESS: u64 = 0;
/// Bits of a tag.
pub(crate) const TAG_BITS: u32 = 15;
const TAG_SHIFT: u32 = ADDRESS_BITS;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
const TENTATIVE_BIT: u64 = 1 << 63;
/// Entries per bucket; the eighth word is the overflow pointer.
pub(crate) const BUCKET_ENTRIES: usize = 7;

/// A key's 64-bit hash. The low bits choose the bucket (as many as the table is large),
/// the top 15 the tag, so a key keeps its tag when the table doubles and its bucket `b`
/// becomes either `b` or `b + old_len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct KeyHash(pub(crate) u64);

impl KeyHash {
    /// The tag: bits 49..=63 of the hash, with 0 mapped to 1 so that no live entry is
    /// the all-zero empty word.
    pub(crate) fn tag(self) -> u16 {
        let tag = (self.0 >> (64 - TAG_BITS)) as u16;
        tag.max(1)
    }

    /// The bucket in a table of `len` buckets (a power of two).
    pub(crate) fn bucket(self, len: usize) -> usize {
        debug_assert!(len.is_power_of_two());
        (self.0 as usize) & (len - 1)
    }
}

/// An index entry: 48-bit address, 15-bit tag, tentative bit; the word 0 is an empty slot.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Entry(pub(crate) u64);

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return f.write_str("Entry(empty)");
        }
        f.debug_struct("Entry")
            .field("address", &self.address())
            .field("tag", &self.tag())
            .field("tentative", &self.is_tentative())
            .finish()
    }
}

impl Entry {
    /// The empty slot.
    pub(crate) const EMPTY: Entry = Entry(0);

    /// An entry for `tag` (1..2^15) pointing at `address` (at most 48 bits).
    pub(crate) fn new(address: u64, tag: u16, tentative: bool) -> Entry {
        assert!(
            address <= MAX_ADDRESS,
            "address {address:#x} exceeds 48 bits"
        );
        debug_assert!(tag != 0 && u64::from(tag) <= TAG_MASK);
        let tentative = if tentative { TENTATIVE_BIT } else { 0 };
        Entry(address | (u64::from(tag) << TAG_SHIFT) | tentative)
    }

    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub(crate) fn address(self) -> u64 {
        self.0 & MAX_ADDRESS
    }

    pub(crate) fn tag(self) -> u16 {
        ((self.0 >> TAG_SHIFT) & TAG_MASK) as u16
    }

    pub(crate) fn is_tentative(self) -> bool {
        self.0 & TENTATIVE_BIT != 0
    }

    /// A live (non-tentative) entry of `tag`.
    pub(crate) fn is_final_for(self, tag: u16) -> bool {
        !self.is_empty() && !self.is_tentative() && self.tag() == tag
    }

    /// The same tag and tentative bit, another address.
    pub(crate) fn with_address(self, address: u64) -> Entry {
        Entry::new(address, self.tag(), self.is_tentative())
    }
}

/// Seven entries and an overflow pointer in one cache line.
#[repr(C, align(64))]
pub(crate) struct Bucket {
    pub(crate) entries: [AtomicU64; BUCKET_ENTRIES],
    /// 0, or 1 + the next bucket's index in the table's [`OverflowBuckets`].
    pub(crate) overflow: AtomicU64,
}

#[cfg(not(feature = "shuttle"))]
const _: () = {
    assert!(size_of::<Bucket>() == 64);
    assert!(align_of::<Bucket>() == 64);
};

impl Bucket {
    #[cfg(feature = "shuttle")]
    fn new() -> Bucket {
        Bucket {
            entries: std::array::from_fn(|_| AtomicU64::new(0)),
            overflow: AtomicU64::new(0),
        }
    }
}

/// `n` empty buckets.
fn zeroed_buckets(n: usize) -> Box<[Bucket]> {
    #[cfg(not(feature = "shuttle"))]
    {
        // Zeroed memory from the allocator: a large table costs no time until its pages
        // are touched.
        let buckets = Box::<[Bucket]>::new_zeroed_slice(n);
        // SAFETY: `Bucket` is `repr(C)` and consists only of `AtomicU64`s, which have the
        // same in-memory representation as `u64`, for which all-zero bytes are a valid
        // value (the empty entry and "no overflow bucket").
        unsafe { buckets.assume_init() }
    }
    #[cfg(feature = "shuttle")]
    {
        // Shuttle's atomics carry bookkeeping that zero bytes do not make.
        (0..n).map(|_| Bucket::new()).collect()
    }
}

/// Buckets in the first page of the overflow allocator; page `p` holds
/// `FIRST_PAGE_BUCKETS << p` buckets, so 40 pages address more than 2^45 buckets.
const FIRST_PAGE_BUCKETS: usize = 64;
const OVERFLOW_PAGES: usize = 40;

/// FASTER's fixed-size-page allocator for overflow buckets: buckets are named by an index
/// (stored + 1 in the overflow word), taken by a fetch-and-add on a counter from pages
/// allocated on first use. Pages never move, so a `&Bucket` stays valid as long as the
/// allocator. A bucket that lost the race to be linked is put on a free list and handed
/// out again; linked buckets are freed only with the whole allocator (their table).
pub(crate) struct OverflowBuckets {
    // `OnceLock` initializers only allocate, so a thread never waits long in one.
    pages: [OnceLock<Box<[Bucket]>>; OVERFLOW_PAGES],
    next: AtomicUsize,
    /// Buckets allocated but never linked (empty), for reuse.
    unlinked: Mutex<Vec<usize>>,
    unlinked_len: AtomicUsize,
}

impl OverflowBuckets {
    pub(crate) fn new() -> Self {
        OverflowBuckets {
            pages: std::array::from_fn(|_| OnceLock::new()),
            next: AtomicUsize::new(0),
            unlinked: Mutex::new(Vec::new()),
            unlinked_len: AtomicUsize::new(0),
        }
    }

    /// Page and position in it of bucket `index`.
    fn locate(index: usize) -> (usize, usize) {
        // Page p starts at FIRST * (2^p - 1).
        let scaled = index / FIRST_PAGE_BUCKETS + 1;
        let page = (usize::BITS - 1 - scaled.leading_zeros()) as usize;
        let start = FIRST_PAGE_BUCKETS * ((1 << page) - 1);
        (page, index - start)
    }

    /// An empty bucket that no one else holds, and its index.
    pub(crate) fn allocate(&self) -> (usize, &Bucket) {
        if self.unlinked_len.load(Ordering::Relaxed) > 0 {
            let mut unlinked = self.unlinked.lock();
            if let Some(index) = unlinked.pop() {
                self.unlinked_len.store(unlinked.len(), Ordering::Relaxed);
                return (index, self.get(index));
            }
        }
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let (page, offset) = Self::locate(index);
        assert!(page < OVERFLOW_PAGES, "overflow buckets exhausted");
        let page = self.pages[page].get_or_init(|| zeroed_buckets(FIRST_PAGE_BUCKETS << page));
        (index, &page[offset])
    }

    /// Returns a bucket from [`allocate`](Self::allocate) that was never linked into a
    /// chain (so no other thread can have seen it), still empty.
    pub(crate) fn give_back(&self, index: usize) {
        let bucket = self.get(index);
        debug_assert!(
            bucket
                .entries
                .iter()
                .all(|e| e.load(Ordering::Relaxed) == 0)
                && bucket.overflow.load(Ordering::Relaxed) == 0
        );
        let mut unlinked = self.unlinked.lock();
        unlinked.push(index);
        self.unlinked_len.store(unlinked.len(), Ordering::Relaxed);
    }

    /// Bucket `index`, which [`allocate`](Self::allocate) handed out.
    pub(crate) fn get(&self, index: usize) -> &Bucket {
        let (page, offset) = Self::locate(index);
        let page = self.pages[page]
            .get()
            .expect("an overflow index names an allocated page");
        &page[offset]
    }

    /// Buckets handed out and not given back.
    pub(crate) fn in_use(&self) -> usize {
        self.next.load(Ordering::Relaxed) - self.unlinked_len.load(Ordering::Relaxed)
    }

    /// Bytes of bucket pages allocated.
    pub(crate) fn size_bytes(&self) -> usize {
        self.pages
            .iter()
            .filter_map(|p| p.get())
            .map(|p| p.len() * size_of::<Bucket>())
            .sum()
    }
}

/// One version of the hot index: a power-of-two array of buckets and the overflow
/// buckets chained from them.
pub(crate) struct Table {
    buckets: Box<[Bucket]>,
    overflow: OverflowBuckets,
}

impl Table {
    /// A table of `len` empty buckets (`len` a power of two).
    pub(crate) fn new(len: usize) -> Self {
        assert!(
            len.is_power_of_two(),
            "table length {len} is not a power of two"
        );
        Table {
            buckets: zeroed_buckets(len),
            overflow: OverflowBuckets::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.buckets.len()
    }

    /// The home bucket `index`.
    pub(crate) fn bucket(&self, index: usize) -> &Bucket {
        &self.buckets[index]
    }

    /// The next bucket in `bucket`'s chain, if any.
    pub(crate) fn next(&self, bucket: &Bucket) -> Option<&Bucket> {
        match bucket.overflow.load(Ordering::Acquire) {
            0 => None,
            link => Some(self.overflow.get(link as usize - 1)),
        }
    }

    /// Links a new overflow bucket after `last` (which had none when the caller looked)
    /// and returns it; if another thread linked one first, returns `None` and the caller
    /// rescans.
    pub(crate) fn try_append(&self, last: &Bucket) -> Option<&Bucket> {
        let (index, bucket) = self.overflow.allocate();
        match last.overflow.compare_exchange(
            0,
            index as u64 + 1,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(_) => Some(bucket),
            Err(_) => {
                self.overflow.give_back(index);
                None
            }
        }
    }

    /// Links a new overflow bucket after `last`, for a writer no other thread races (a
    /// grow filling a bucket chain of the new table).
    pub(crate) fn append_unshared(&self, last: &Bucket) -> &Bucket {
        let (index, bucket) = self.overflow.allocate();
        let before = last.overflow.swap(index as u64 + 1, Ordering::Release);
        debug_assert_eq!(before, 0);
        bucket
    }

    /// Calls `f` on every bucket of home bucket `index`'s chain.
    pub(crate) fn for_each_in_chain(&self, index: usize, mut f: impl FnMut(&Bucket)) {
        let mut bucket = Some(self.bucket(index));
        while let Some(b) = bucket {
            f(b);
            bucket = self.next(b);
        }
    }

    /// Overflow buckets in use.
    pub(crate) fn overflow_buckets(&self) -> usize {
        self.overflow.in_use()
    }

    /// Memory held: home buckets plus overflow pages.
    pub(crate) fn size_bytes(&self) -> usize {
        self.buckets.len() * size_of::<Bucket>() + self.overflow.size_bytes()
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    #[test]
    fn entry_bits() {
        let e = Entry::new(0x0000_ABCD_1234_5678, 0x7FFF, true);
        assert_eq!(e.0, 0xFFFF_ABCD_1234_5678);
        assert_eq!(e.address(), 0xABCD_1234_5678);
        assert_eq!(e.tag(), 0x7FFF);
        assert!(e.is_tentative());
        let f = Entry::new(MAX_ADDRESS, 1, false);
        assert_eq!(f.0, 0x0001_FFFF_FFFF_FFFF);
        assert_eq!(f.tag(), 1);
        assert!(!f.is_tentative());
        assert!(f.is_final_for(1) && !f.is_final_for(2) && !e.is_final_for(0x7FFF));
        assert_eq!(f.with_address(7).0, 0x0001_0000_0000_0007);
        // An entry of the smallest tag at address 0 is still not empty.
        assert!(!Entry::new(INVALID_ADDRESS, 1, false).is_empty());
        assert!(Entry::EMPTY.is_empty());
    }

    #[test]
    #[should_panic(expected = "exceeds 48 bits")]
    fn entry_rejects_wide_addresses() {
        Entry::new(1 << 48, 1, false);
    }

    #[test]
    fn tag_and_bucket_come_from_opposite_ends_of_the_hash() {
        let h = KeyHash(0xFFFE_0000_0000_0005);
        assert_eq!(h.tag(), 0x7FFF);
        assert_eq!(h.bucket(8), 5);
        assert_eq!(h.bucket(4), 1);
        assert_eq!(h.bucket(1), 0);
        assert_eq!(KeyHash(0x0002_0000_0000_0000).tag(), 1);
        assert_eq!(KeyHash(0x0001_FFFF_FFFF_FFFF).tag(), 1, "tag 0 becomes 1");
        assert_eq!(KeyHash(0x8000_0000_0000_0000).tag(), 0x4000);
        // Doubling a table sends bucket b to b or b + old_len, by one more hash bit.
        for h in [0u64, 3, 4, 7, 0xDEAD_BEEF, u64::MAX] {
            let h = KeyHash(h);
            let old = h.bucket(4);
            let new = h.bucket(8);
            assert!(new == old || new == old + 4);
            assert_eq!(new == old + 4, h.0 & 4 != 0);
        }
    }

    #[test]
    fn bucket_is_one_cache_line() {
        let t = Table::new(4);
        for i in 0..4 {
            assert_eq!(std::ptr::from_ref(t.bucket(i)) as usize % 64, 0);
        }
        assert_eq!(t.size_bytes(), 256);
    }

    #[test]
    fn overflow_allocator_pages() {
        assert_eq!(OverflowBuckets::locate(0), (0, 0));
        assert_eq!(OverflowBuckets::locate(63), (0, 63));
        assert_eq!(OverflowBuckets::locate(64), (1, 0));
        assert_eq!(OverflowBuckets::locate(191), (1, 127));
        assert_eq!(OverflowBuckets::locate(192), (2, 0));
        let a = OverflowBuckets::new();
        let mut seen = std::collections::HashSet::new();
        for i in 0..300 {
            let (index, bucket) = a.allocate();
            assert_eq!(index, i);
            assert_eq!(std::ptr::from_ref(bucket) as usize % 64, 0);
            assert!(seen.insert(std::ptr::from_ref(bucket) as usize));
            assert!(std::ptr::eq(bucket, a.get(index)));
        }
        assert_eq!(a.in_use(), 300);
        a.give_back(17);
        assert_eq!(a.in_use(), 299);
        assert_eq!(a.allocate().0, 17);
        assert_eq!(a.size_bytes(), (64 + 128 + 256) * 64);
    }

    #[test]
    fn chains_grow_through_overflow_buckets() {
        let t = Table::new(2);
        let first = t.try_append(t.bucket(1)).expect("no one raced");
        assert!(t.try_append(t.bucket(1)).is_none(), "already linked");
        let second = t.append_unshared(first);
        let mut chain = Vec::new();
        t.for_each_in_chain(1, |b| chain.push(std::ptr::from_ref(b)));
        assert_eq!(
            chain,
            [
                std::ptr::from_ref(t.bucket(1)),
                std::ptr::from_ref(first),
                std::ptr::from_ref(second)
            ]
        );
        assert_eq!(t.overflow_buckets(), 2);
    }
}
