//! Mini-pages in the pool: their byte views, allocation (with the background evictor's
//! wake-up), publication in the mapping table, retirement, and copy-to-tail of a hot
//! mini-page (Bf-Tree §4). Also the pure edits of a mini-page's records (`place`,
//! `apply`, marking records clean, dropping cold clean ones).
//!
//! Invariants: a block is read or written only under its page's lock (or, for a
//! Reserved block, by the thread that reserved it); a block is published with one store
//! to the page's mapping word and retired only after it is unpublished, so the evictor,
//! which finds blocks from the pool's head, sees either the page's mini-page or a block
//! it may skip.
//!
//! Uses: `leaf` (the mini-page header), `node`, `mapping`, `signal`, `stats`.

use std::marker::PhantomData;

use crate::error::{Error, Result};
use crate::pool::{AllocError, Block};
use crate::storage::PageNo;

use super::leaf::{self, MINI_HEADER_BYTES, MiniHeader};
use super::mapping::{self, Location, PageId};
use super::node::{self, Fences, NodeKind, NodeMut, NodeRef, RecordType, WriteError};
use super::stats::bump;
use super::{Core, Op};

/// The page-lock guards under which a page's mini-page may be seen: while one is held,
/// the page's location cannot change, so the block it names stays allocated and is
/// written by nobody but the holder of the write lock.
pub(super) trait PageLock {
    /// Where the page lives while the guard is held.
    fn location(&self) -> Location;
    /// The page locked.
    fn id(&self) -> PageId;
}

impl PageLock for mapping::ReadGuard<'_> {
    fn location(&self) -> Location {
        mapping::ReadGuard::location(self)
    }
    fn id(&self) -> PageId {
        mapping::ReadGuard::id(self)
    }
}

impl PageLock for mapping::WriteGuard<'_> {
    fn location(&self) -> Location {
        mapping::WriteGuard::location(self)
    }
    fn id(&self) -> PageId {
        mapping::WriteGuard::id(self)
    }
}

/// A page's mini-page seen under the page's lock ([`Core::mini_page`]). It borrows the
/// lock guard for `'g` (as crossbeam-epoch's `Shared<'g, T>` borrows its `Guard`), so no
/// view outlives the lock that makes reading the block safe, and no mutable view of the
/// same page ([`MiniPageMut`], which needs the write guard mutably) can exist beside it.
#[derive(Clone, Copy)]
pub(super) struct MiniPage<'g> {
    block: Block,
    _lock: PhantomData<&'g ()>,
}

impl<'g> MiniPage<'g> {
    /// The pool block holding the mini-page.
    pub(super) fn block(&self) -> Block {
        self.block
    }

    /// The mini-page's header: its page, leaf page and whether it is a mirror.
    pub(super) fn header(&self) -> MiniHeader {
        // SAFETY: the page's lock, borrowed for `'g`, keeps the published block live.
        unsafe { MiniHeader::of(&self.block) }
    }

    /// The mini-page's node.
    pub(super) fn node(&self) -> NodeRef<'g> {
        // SAFETY: the page's lock is held for `'g`, and no mutable view can be made
        // while it is borrowed shared.
        unsafe { mini_ref(&self.block) }
    }
}

/// A page's mini-page seen under the page's write lock, exclusively
/// ([`Core::mini_page_mut`]): it borrows the write guard mutably, so no other view of the
/// mini-page is alive while it is changed.
pub(super) struct MiniPageMut<'g> {
    block: Block,
    _lock: PhantomData<&'g mut ()>,
}

impl MiniPageMut<'_> {
    /// The pool block holding the mini-page.
    pub(super) fn block(&self) -> Block {
        self.block
    }

    /// The mini-page's header.
    pub(super) fn header(&self) -> MiniHeader {
        // SAFETY: the page's write lock is held while `self` lives.
        unsafe { MiniHeader::of(&self.block) }
    }

    /// The mini-page's node, to change.
    pub(super) fn node_mut(&mut self) -> NodeMut<'_> {
        // SAFETY: the write lock is held while `self` lives, and `&mut self` makes this
        // the only view of the block.
        unsafe { mini_mut(&self.block) }
    }

    /// Replaces the mini-page's node bytes (not its header) with `bytes`, a node of the
    /// same size.
    pub(super) fn overwrite(&mut self, bytes: &[u8]) {
        // SAFETY: as for `node_mut`.
        unsafe { node_bytes_mut(&self.block) }.copy_from_slice(bytes);
    }
}

/// A view of the mini-page in `block`.
///
/// # Safety
///
/// The caller holds the owning page's lock (shared or exclusive) for all of `'a`, so the
/// block is live and no one writes it while the view exists.
unsafe fn mini_ref<'a>(block: &Block) -> NodeRef<'a> {
    // SAFETY: the payload is `size_bytes` bytes of live pool memory (the caller's lock
    // keeps the block allocated for `'a`) and nobody writes it meanwhile.
    let bytes = unsafe { std::slice::from_raw_parts(block.payload_ptr(), block.size_bytes()) };
    NodeRef::trusted(&bytes[MINI_HEADER_BYTES..])
}

/// A mutable view of the mini-page in `block`.
///
/// # Safety
///
/// The caller holds the owning page's write lock for all of `'a`, and no other view of
/// the block is alive meanwhile.
unsafe fn mini_mut<'a>(block: &Block) -> NodeMut<'a> {
    // SAFETY: guaranteed by the caller.
    NodeMut::trusted(unsafe { node_bytes_mut(block) })
}

/// The mutable node bytes of a mini-page block, without its header: the evictor may read
/// a published block's header without the page lock, so no `&mut` may cover it.
///
/// # Safety
///
/// The caller holds the owning page's write lock for all of `'a`, and no other view of
/// the node bytes is alive meanwhile.
unsafe fn node_bytes_mut<'a>(block: &Block) -> &'a mut [u8] {
    // SAFETY: the payload is `size_bytes` bytes of pool memory and starts with the
    // 16-byte header; the caller's write lock makes the bytes after it exclusively ours.
    unsafe {
        std::slice::from_raw_parts_mut(
            block.payload_ptr().add(MINI_HEADER_BYTES),
            block.size_bytes() - MINI_HEADER_BYTES,
        )
    }
}

/// A block just allocated and not yet published: nobody else, not even the evictor,
/// looks at a Reserved block, so its bytes are its owner's alone until
/// [`Core::publish`] makes it a page's mini-page or [`Core::discard`] frees it.
pub(super) struct FreshBlock {
    block: Block,
}

impl FreshBlock {
    /// The block's bytes, header included.
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the block is Reserved and owned by `self` (see the type's docs); the
        // payload is `size_bytes` bytes of pool memory.
        unsafe { std::slice::from_raw_parts_mut(self.block.payload_ptr(), self.block.size_bytes()) }
    }
}

/// The block size a mini-page needs for the records of `mini` that `keep` keeps, under
/// `fences` that give the same prefix as `mini`'s (the stored suffixes do not change).
pub(super) fn mini_block_bytes(
    mini: &NodeRef<'_>,
    fences: &Fences<'_>,
    keep: impl Fn(&node::RecordView<'_>) -> bool,
) -> usize {
    let records: usize = mini
        .iter()
        .filter(|r| keep(r))
        .map(|r| leaf::record_cost(r.suffix().len(), r.value().len()))
        .sum();
    MINI_HEADER_BYTES + leaf::empty_node_bytes(fences) + records
}

/// Fences for a new regular mini-page: the leaf's key prefix, if it has one.
pub(super) fn mini_fences(key: &[u8], prefix_len: usize) -> Fences<'_> {
    if prefix_len > 0 {
        Fences::Prefix(&key[..prefix_len])
    } else {
        Fences::None
    }
}

/// Puts a record into a mini-page if it has room (a write's reference bit set, a cached
/// read's clear); false if the mini-page is full.
pub(super) fn place(
    mini: &mut NodeMut<'_>,
    key: &[u8],
    value: &[u8],
    record_type: RecordType,
) -> bool {
    match mini.upsert(key, value, record_type) {
        Ok(up) => {
            mini.set_ref_bit(up.index(), record_type.is_dirty());
            true
        }
        Err(WriteError::Full) => false,
        Err(e) => unreachable!("a checked key fits its mini-page: {e:?}"),
    }
}

/// Applies one dirty record to a leaf node in place; `Ok(false)` if it does not fit.
/// Any other refusal (a key outside the leaf's fences) means the leaf page read from
/// disk is not the one its routing says: the caller reports it as damage.
pub(super) fn apply(
    node: &mut NodeMut<'_>,
    key: &[u8],
    value: &[u8],
    t: RecordType,
) -> Result<bool, WriteError> {
    if t.exists() {
        match node.upsert(key, value, t.dirty()) {
            Ok(_) => Ok(true),
            Err(WriteError::Full) => Ok(false),
            Err(e) => Err(e),
        }
    } else {
        if let Ok(i) = node.as_ref().search(key) {
            node.remove(i);
        }
        Ok(true)
    }
}

/// Turns every record into its clean form once the leaf page holds it: `Insert` becomes
/// `Cache`, `Tombstone` becomes `Phantom`.
pub(super) fn mark_clean(node: &mut NodeMut<'_>) {
    for i in 0..node.len() {
        let clean = node.as_ref().record_type(i).clean();
        node.set_record_type(i, clean);
    }
}

/// Drops the clean records of a regular mini-page whose reference bit is clear (cached
/// reads and merged writes not touched since the last pass); returns whether it dropped
/// any. Dirty records and referenced clean ones stay, in place.
pub(super) fn drop_cold_clean(mini: &mut NodeMut<'_>) -> bool {
    mini.retain(|r| r.record_type().is_dirty() || r.ref_bit())
}

/// A mini-page's node once its dirty records are in the leaf page: a mirror keeps every
/// live record (it still mirrors the leaf); a regular mini-page keeps only the records
/// read since the last pass, other than `except` (the record just merged), as clean
/// copies with their reference bits cleared.
pub(super) fn clean_after_merge(
    mini: &NodeRef<'_>,
    mirror: bool,
    except: Option<&[u8]>,
) -> Vec<u8> {
    let mut scratch = vec![0u8; mini.node_size_bytes()];
    node::copy_into(mini, &mut scratch, mini.fences(), |r| {
        if mirror {
            r.record_type().exists()
        } else {
            r.ref_bit() && except.is_none_or(|k| r.cmp_key(k) != std::cmp::Ordering::Equal)
        }
    })
    .expect("a subset of a node fits the same size");
    let mut rebuilt = NodeMut::trusted(&mut scratch);
    mark_clean(&mut rebuilt);
    rebuilt.clear_ref_bits();
    scratch
}

impl Core {
    /// The mini-page of the page locked by `page`, if the page has one.
    pub(super) fn mini_page<'g>(&self, page: &'g impl PageLock) -> Option<MiniPage<'g>> {
        let Location::Mini(offset) = page.location() else {
            return None;
        };
        Some(MiniPage {
            block: self.block(offset),
            _lock: PhantomData,
        })
    }

    /// The mini-page of the page write-locked by `page`, exclusively, if it has one.
    pub(super) fn mini_page_mut<'g>(
        &self,
        page: &'g mut mapping::WriteGuard<'_>,
    ) -> Option<MiniPageMut<'g>> {
        let Location::Mini(offset) = page.location() else {
            return None;
        };
        Some(MiniPageMut {
            block: self.block(offset),
            _lock: PhantomData,
        })
    }

    /// The block at a mapping-table offset. The caller holds the page's lock.
    pub(super) fn block(&self, offset: u64) -> Block {
        // SAFETY: the mapping table holds only offsets of published mini-page blocks,
        // which stay allocated while their page lock (held by the caller) is held.
        unsafe { self.pool.block_at(offset) }.expect("a mapped mini-page is a live block")
    }

    /// Allocates a block of at least `size` payload bytes, evicting if needed;
    /// `WouldBlock` passes up.
    pub(super) fn alloc(&self, size: usize) -> Result<FreshBlock, Op> {
        match self.pool.alloc(size) {
            Ok(block) => {
                self.after_alloc();
                Ok(FreshBlock { block })
            }
            Err(AllocError::WouldBlock) => Err(Op::WouldBlock),
            Err(e) => Err(Op::Fail(Error::InvalidConfig(format!(
                "mini-page allocation failed: {e}"
            )))),
        }
    }

    pub(super) fn create_mini(
        &self,
        page: &mapping::WriteGuard<'_>,
        prefix_len: usize,
        leaf_no: PageNo,
        key: &[u8],
        value: &[u8],
        record_type: RecordType,
    ) -> Result<(), Op> {
        let fences = mini_fences(key, prefix_len);
        let need = MINI_HEADER_BYTES
            + leaf::empty_node_bytes(&fences)
            + leaf::record_cost(key.len() - prefix_len, value.len());
        let mut block = self.alloc(need)?;
        let bytes = block.bytes_mut();
        MiniHeader {
            pid: page.id(),
            leaf: leaf_no,
            mirror: false,
            owner: self.owner,
        }
        .write(bytes);
        let mut mini = NodeMut::init(&mut bytes[MINI_HEADER_BYTES..], NodeKind::Mini, fences)
            .expect("the block was sized for an empty node");
        let i = mini
            .insert(key, value, record_type)
            .expect("the block was sized for the record");
        mini.set_ref_bit(i, record_type.is_dirty());
        self.publish(page, block);
        bump(&self.counters.mini_pages_created);
        Ok(())
    }

    /// Allocates a block of at least `size` payload bytes if the pool has an unused one;
    /// never evicts.
    pub(super) fn try_alloc(&self, size: usize) -> Option<FreshBlock> {
        self.pool
            .try_alloc(size)
            .ok()
            .map(|block| FreshBlock { block })
    }

    /// Makes `fresh`, initialised, the page's mini-page.
    pub(super) fn publish(&self, page: &mapping::WriteGuard<'_>, fresh: FreshBlock) -> Block {
        let block = fresh.block;
        // SAFETY: the block is initialised, and we hold the page's write lock, which
        // the evictor must take before it can look at the block.
        unsafe { self.pool.publish(&block) };
        page.set_location(Location::Mini(block.offset()));
        block
    }

    /// Frees a block that was never published.
    pub(super) fn discard(&self, fresh: FreshBlock) {
        // SAFETY: never published, so nobody else knows the block.
        unsafe { self.pool.free(fresh.block) };
    }

    /// Frees a mini-page block that the mapping table no longer points to.
    pub(super) fn retire(&self, block: Block) {
        // SAFETY: the caller holds the page's write lock and has pointed the mapping table
        // elsewhere, so the block is unreachable; pool blocks are only ever read under the
        // page lock, so no reader can still be copying from it.
        unsafe { self.pool.free(block) };
    }

    /// Copies a mini-page out of the copy-on-access region to the tail (§5.5), keeping its
    /// dirty records and the clean ones referenced since the last copy. Returns the new
    /// block, or `None` when nothing was worth keeping (the page now maps to its leaf
    /// page). Never merges: dirty records wait for eviction, which batches its leaf IO,
    /// or for the mini-page to fill, so a write that lands here does no leaf IO.
    pub(super) fn copy_to_tail(&self, page: &mapping::WriteGuard<'_>) -> Option<Block> {
        let old = self
            .mini_page(page)
            .expect("copy-to-tail of a page with a mini-page");
        let (block, header, mini) = (old.block(), old.header(), old.node());
        let worth = |r: &node::RecordView<'_>| r.ref_bit() || r.record_type().is_dirty();
        // A mirror must stay complete: whole if any record is worth keeping, else dropped.
        let whole = header.mirror && mini.iter().any(|r| worth(&r));
        let keep = |r: &node::RecordView<'_>| whole || worth(r);
        if !mini.iter().any(|r| keep(&r)) {
            page.set_location(Location::Leaf(header.leaf.0));
            self.retire(block);
            bump(&self.counters.copy_on_access);
            return None;
        }
        let need = mini_block_bytes(&mini, &mini.fences(), keep);
        // An eighth of room to spare, so the next cached record does not force a growth
        // at once (the class rounding may leave none), but never more than the old block.
        let target = need.max(block.size_bytes().min(need + need / 8));
        // Best effort: without room the block stays where it is.
        let Ok(mut moved) = self.alloc(target) else {
            return Some(block);
        };
        let new = moved.bytes_mut();
        header.write(new);
        let mut node = node::copy_into(&mini, &mut new[MINI_HEADER_BYTES..], mini.fences(), |r| {
            keep(r)
        })
        .expect("sized for the kept records");
        node.clear_ref_bits();
        let moved = self.publish(page, moved);
        self.retire(block);
        bump(&self.counters.copy_on_access);
        Some(moved)
    }
}
