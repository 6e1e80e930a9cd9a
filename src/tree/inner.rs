//! Inner nodes: pinned in memory, read under optimistic latch coupling (Bf-Tree §3.4).
//!
//! An inner node's bytes use the shared node layout (kind `Inner`): each record maps a
//! separator key — the lowest key of the child's range — to an 8-byte little-endian child
//! reference. On level 1 the child is a `PageId` of the mapping table; above it is the
//! address of another [`InnerNode`]. The first record's key equals the node's low fence
//! (the empty key for the leftmost node of a level), so every key the node covers has a
//! child: the last record whose key is ≤ it.
//!
//! Writers never modify published bytes. They build a new buffer, publish it with one
//! atomic pointer store while holding the node's version lock, and retire the old buffer
//! through crossbeam-epoch. Readers therefore never race with a write at the byte level;
//! the version lock tells them when what they read is no longer current (restart).
//!
//! The only way to see a node's bytes is an [`InnerSnapshot`]: the version and the
//! buffer published at it, each read once, so every index a reader computes refers to
//! the buffer it will use (two loads of the pointer could see two buffers, split
//! between them). A snapshot's bytes stay valid while its epoch guard is pinned, but
//! they are only *current* while [`InnerSnapshot::validate`] succeeds; a writer turns a
//! snapshot into an [`InnerLock`], which fails if the node changed since the snapshot,
//! and publishes through the lock alone.
//! `InnerNode` structs themselves are never freed while the tree lives (inner nodes do
//! not merge), so a child pointer read from any published bytes stays dereferenceable.

use std::ptr;

use crossbeam_epoch::Guard;

use super::node::{self, Fences, NodeKind, NodeRef, RecordType};
use super::olc::{self, Restart, VersionLock};
use crate::sync::atomic::{AtomicPtr, Ordering};

/// One inner node.
pub(crate) struct InnerNode {
    version: VersionLock,
    /// 1 when children are `PageId`s (the last inner level), else children are inner
    /// nodes one level down. Never changes.
    pub(crate) level: u32,
    bytes: AtomicPtr<u8>,
    size_bytes: usize,
}

// SAFETY: the raw bytes pointer is only written under the version lock and read through
// atomics; the bytes it points to are immutable once published and freed through epochs.
unsafe impl Send for InnerNode {}
// SAFETY: as above.
unsafe impl Sync for InnerNode {}

impl InnerNode {
    /// A node on `level` owning `bytes` (a valid inner node of the tree's inner size).
    pub(crate) fn new(level: u32, bytes: Box<[u8]>) -> Box<InnerNode> {
        let size_bytes = bytes.len();
        Box::new(InnerNode {
            version: VersionLock::new(),
            level,
            bytes: AtomicPtr::new(Box::into_raw(bytes).cast::<u8>()),
            size_bytes,
        })
    }

    /// An optimistic read of the node: its version, then its bytes. `Err(Restart)` if
    /// the node is obsolete. Waits while a writer holds the lock.
    pub(crate) fn snapshot<'n, 'g>(
        &'n self,
        guard: &'g Guard,
    ) -> Result<InnerSnapshot<'n, 'g>, Restart>
    where
        'n: 'g,
    {
        let version = self.version.read_begin()?;
        Ok(InnerSnapshot {
            node: self,
            version,
            bytes: self.load(guard),
        })
    }

    /// `Ok` if no writer changed the node since a snapshot at `version`.
    pub(crate) fn validate(&self, version: u64) -> Result<(), Restart> {
        self.version.validate(version)
    }

    /// The node's current bytes, immutable and valid for as long as `guard` is pinned.
    /// Private: a reader that loads the pointer twice may get two buffers.
    fn load<'g>(&'g self, _guard: &'g Guard) -> &'g [u8] {
        let p = self.bytes.load(Ordering::Acquire);
        // SAFETY: `p` came from `Box::<[u8]>::into_raw` of `size_bytes` bytes; buffers
        // are never written after publication and are freed only through
        // `Guard::defer_unchecked` after being unpublished, which waits for every guard
        // pinned before the unpublish — including `_guard`, which the result borrows.
        unsafe { std::slice::from_raw_parts(p, self.size_bytes) }
    }

    /// Publishes `new` as the node's bytes. The caller holds the version lock.
    fn replace(&self, new: Box<[u8]>, guard: &Guard) {
        assert_eq!(new.len(), self.size_bytes, "inner nodes keep their size");
        debug_assert!(NodeRef::parse(&new).is_ok());
        let old = self
            .bytes
            .swap(Box::into_raw(new).cast::<u8>(), Ordering::AcqRel);
        let size = self.size_bytes;
        let old = old as usize;
        // SAFETY: `old` was the published buffer, allocated by `Box::into_raw` with `size`
        // bytes; it is unpublished now, and the deferred free runs only once no guard
        // that could have loaded it remains pinned.
        unsafe {
            guard.defer_unchecked(move || {
                drop(Box::from_raw(ptr::slice_from_raw_parts_mut(
                    old as *mut u8,
                    size,
                )));
            });
        }
    }
}

/// One optimistic read of an inner node: the version it was read at and the buffer
/// published at that version, each loaded once ([`InnerNode::snapshot`]). The node lives
/// for `'n` (inner nodes live as long as their tree), the bytes for `'g`, the epoch guard
/// they were read under.
#[derive(Clone, Copy)]
pub(crate) struct InnerSnapshot<'n, 'g> {
    node: &'n InnerNode,
    version: u64,
    bytes: &'g [u8],
}

impl<'n, 'g> InnerSnapshot<'n, 'g> {
    /// The node read.
    pub(crate) fn node(&self) -> &'n InnerNode {
        self.node
    }

    /// The version the bytes were read at.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// The bytes as a node; what it says is current only if [`Self::validate`] passes
    /// after it was read.
    pub(crate) fn view(&self) -> NodeRef<'g> {
        NodeRef::trusted(self.bytes)
    }

    /// `Ok` if no writer changed the node since the snapshot.
    pub(crate) fn validate(&self) -> Result<(), Restart> {
        self.node.version.validate(self.version)
    }

    /// Takes the node's version lock, failing if anyone wrote since the snapshot: the
    /// snapshot's bytes are then the node's bytes until the lock drops.
    pub(crate) fn lock(self) -> Result<InnerLock<'n, 'g>, Restart> {
        let lock = self.node.version.upgrade(self.version)?;
        Ok(InnerLock {
            snapshot: self,
            _lock: lock,
        })
    }
}

/// An inner node's version lock, taken from a snapshot that is therefore current. The
/// lock is released, bumping the version, when this drops.
pub(crate) struct InnerLock<'n, 'g> {
    snapshot: InnerSnapshot<'n, 'g>,
    _lock: olc::WriteGuard<'n>,
}

impl<'n, 'g> InnerLock<'n, 'g> {
    /// The node locked.
    pub(crate) fn node(&self) -> &'n InnerNode {
        self.snapshot.node
    }

    /// The node's bytes as locked (before any [`Self::publish`] through this lock).
    pub(crate) fn view(&self) -> NodeRef<'g> {
        self.snapshot.view()
    }

    /// The node's bytes as locked, to copy.
    pub(crate) fn bytes(&self) -> &'g [u8] {
        self.snapshot.bytes
    }

    /// Publishes `new` as the node's bytes; readers see it at once and find the version
    /// moved when the lock drops.
    pub(crate) fn publish(&self, new: Box<[u8]>, guard: &Guard) {
        self.snapshot.node.replace(new, guard);
    }
}

impl Drop for InnerNode {
    fn drop(&mut self) {
        let p = *self.bytes.get_mut();
        // SAFETY: `&mut self` means no reader holds the bytes; `p` came from
        // `Box::into_raw` of `size_bytes` bytes and is freed once, here.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(p, self.size_bytes)) });
    }
}

/// Reads the child reference stored in record `i`.
pub(crate) fn child_ref(node: &NodeRef<'_>, i: usize) -> u64 {
    let v = node.value(i);
    u64::from_le_bytes(v.try_into().expect("inner values are 8 bytes"))
}

/// The child whose range holds `key`: the last record with a key ≤ `key`.
pub(crate) fn child_for(node: &NodeRef<'_>, key: &[u8]) -> usize {
    match node.search(key) {
        Ok(i) => i,
        Err(i) => i.saturating_sub(1),
    }
}

/// The child whose range holds the largest keys below `key`, or `None` if no record of
/// this node lies below `key` (then nothing in the node does).
pub(crate) fn child_before(node: &NodeRef<'_>, key: &[u8]) -> Option<usize> {
    let below = match node.search(key) {
        Ok(i) | Err(i) => i,
    };
    below.checked_sub(1)
}

/// Builds inner-node bytes of `size` from sorted `(key, child)` records.
pub(crate) fn build(
    size: usize,
    low: Option<&[u8]>,
    high: Option<&[u8]>,
    records: &[(Vec<u8>, u64)],
) -> Option<Box<[u8]>> {
    let mut buf = vec![0u8; size].into_boxed_slice();
    node::build_sorted(
        &mut buf,
        NodeKind::Inner,
        Fences::Range { low, high },
        records
            .iter()
            .map(|(k, c)| (k.as_slice(), c.to_le_bytes(), RecordType::Insert)),
    )
    .ok()?;
    Some(buf)
}

/// The records of an inner node as owned `(key, child)` pairs.
pub(crate) fn records(node: &NodeRef<'_>) -> Vec<(Vec<u8>, u64)> {
    (0..node.len())
        .map(|i| {
            let mut k = Vec::new();
            node.key_into(i, &mut k);
            (k, child_ref(node, i))
        })
        .collect()
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    #[test]
    fn child_choice_follows_separators() {
        let records = vec![(b"".to_vec(), 1), (b"m".to_vec(), 2), (b"t".to_vec(), 3)];
        let bytes = build(1024, None, None, &records).unwrap();
        let node = NodeRef::parse(&bytes).unwrap();
        assert_eq!(child_ref(&node, child_for(&node, b"a")), 1);
        assert_eq!(child_ref(&node, child_for(&node, b"m")), 2);
        assert_eq!(child_ref(&node, child_for(&node, b"s")), 2);
        assert_eq!(child_ref(&node, child_for(&node, b"zz")), 3);
        assert_eq!(child_before(&node, b""), None);
        assert_eq!(child_before(&node, b"m"), Some(0));
        assert_eq!(child_before(&node, b"n"), Some(1));
        assert_eq!(records_of(&bytes), records);
    }

    fn records_of(bytes: &[u8]) -> Vec<(Vec<u8>, u64)> {
        records(&NodeRef::parse(bytes).unwrap())
    }

    #[test]
    fn replace_retires_old_bytes_through_epochs() {
        let a = build(512, None, None, &[(b"".to_vec(), 7)]).unwrap();
        let b = build(512, None, None, &[(b"".to_vec(), 8)]).unwrap();
        let node = InnerNode::new(1, a);
        let guard = crossbeam_epoch::pin();
        let before = node.snapshot(&guard).unwrap();
        let lock = before.lock().unwrap();
        lock.publish(b, &guard);
        drop(lock);
        // The old bytes are still readable while the guard is pinned, but no longer
        // current.
        assert_eq!(child_ref(&before.view(), 0), 7);
        assert_eq!(before.validate(), Err(Restart));
        assert!(before.lock().is_err());
        let after = node.snapshot(&guard).unwrap();
        assert_eq!(child_ref(&after.view(), 0), 8);
        assert_eq!(after.validate(), Ok(()));
    }
}
