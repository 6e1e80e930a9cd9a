//! The write view of a node: [`NodeMut`], whose every method keeps the node valid
//! (the layout and invariants are the parent module's). Split from `node.rs` by concept:
//! reading a node is there, changing one is here.

use super::*;

/// A writable view over the bytes of a valid node. Every method keeps the node valid.
pub struct NodeMut<'a> {
    buf: &'a mut [u8],
}

impl fmt::Debug for NodeMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_ref().fmt(f)
    }
}

impl<'a> NodeMut<'a> {
    /// Formats `buf` as an empty node of `kind` covering `fences`; the node size is
    /// `buf.len()`. Every byte of `buf` is overwritten or left unused.
    ///
    /// Fails if the size is outside 16 B .. 32 KiB, the fence records do not fit, a
    /// fence key is longer than [`MAX_KEY_SUFFIX_BYTES`], or two bounded fences do not
    /// satisfy `low < high`.
    pub fn init(
        buf: &'a mut [u8],
        kind: NodeKind,
        fences: Fences<'_>,
    ) -> Result<NodeMut<'a>, NodeError> {
        let size = buf.len();
        if !(MIN_NODE_SIZE_BYTES..=MAX_NODE_SIZE_BYTES).contains(&size) {
            return Err(NodeError::new(format!(
                "node size {size} outside {MIN_NODE_SIZE_BYTES}..={MAX_NODE_SIZE_BYTES}"
            )));
        }
        if NODE_META_SIZE_BYTES + fences.size_bytes() > size {
            return Err(NodeError::new(format!(
                "fence records of {} bytes do not fit a node of {size} bytes",
                fences.size_bytes()
            )));
        }
        // Each fence record to write: its key (None if unbounded) and its role.
        type FenceSlot<'k> = (Option<&'k [u8]>, u8);
        let (flags, fence_keys): (u8, [FenceSlot<'_>; 2]) = match fences {
            Fences::None => (0, [(None, 0); 2]),
            Fences::Prefix(p) => (FLAG_HAS_PREFIX_RECORD, [(Some(p), FENCE_ROLE_PREFIX); 2]),
            Fences::Range { low, high } => {
                if let (Some(l), Some(h)) = (low, high)
                    && l >= h
                {
                    return Err(NodeError::new(
                        "low fence key is not below the high fence key",
                    ));
                }
                (
                    FLAG_HAS_FENCES,
                    [(low, FENCE_ROLE_LOW), (high, FENCE_ROLE_HIGH)],
                )
            }
        };
        if fence_keys
            .iter()
            .any(|(k, _)| k.is_some_and(|k| k.len() > MAX_KEY_SUFFIX_BYTES))
        {
            return Err(NodeError::new(
                "fence key longer than a KV meta can describe",
            ));
        }
        buf[..NODE_META_SIZE_BYTES].fill(0);
        put_u16(buf, NODE_SIZE_AT, size as u16);
        buf[KIND_AT] = kind.to_byte();
        buf[FLAGS_AT] = flags;
        put_u16(buf, DATA_START_AT, size as u16);
        let mut node = NodeMut { buf };
        for (m, &(key, role)) in fence_keys.iter().take(fences.fence_count()).enumerate() {
            let k = key.unwrap_or(&[]);
            let at = node.alloc_data(k.len());
            node.buf[at..at + k.len()].copy_from_slice(k);
            put_meta(node.buf, m, KvMeta::new_fence(at, key, role));
            node.set_count(m + 1);
        }
        put_u16(node.buf, PREFIX_LEN_AT, fences.prefix().len() as u16);
        Ok(node)
    }

    /// A writable view over bytes this process built and kept valid.
    ///
    /// Validated only in debug builds; giving it invalid bytes is a bug.
    pub fn trusted(buf: &'a mut [u8]) -> NodeMut<'a> {
        debug_assert!(
            validate::validate(buf).is_ok(),
            "trusted node is invalid: {:?}",
            validate::validate(buf)
        );
        NodeMut { buf }
    }

    /// A read view of the node as it is now.
    pub fn as_ref(&self) -> NodeRef<'_> {
        NodeRef::from_header(self.buf)
    }

    /// Turns the writable view into a read view for the rest of the borrow.
    pub fn into_ref(self) -> NodeRef<'a> {
        NodeRef::from_header(self.buf)
    }

    /// Number of records, fence records excluded.
    pub fn len(&self) -> usize {
        self.as_ref().len()
    }

    /// Whether the node holds no records (fence records aside).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn count(&self) -> usize {
        usize::from(get_u16(self.buf, COUNT_AT))
    }

    fn set_count(&mut self, n: usize) {
        put_u16(self.buf, COUNT_AT, n as u16);
    }

    fn data_start(&self) -> usize {
        usize::from(get_u16(self.buf, DATA_START_AT))
    }

    fn set_data_start(&mut self, at: usize) {
        put_u16(self.buf, DATA_START_AT, at as u16);
    }

    fn dead_bytes(&self) -> usize {
        usize::from(get_u16(self.buf, DEAD_BYTES_AT))
    }

    fn set_dead_bytes(&mut self, n: usize) {
        put_u16(self.buf, DEAD_BYTES_AT, n as u16);
    }

    fn first(&self) -> usize {
        self.as_ref().first
    }

    /// Takes `len` bytes of free space just below the data region. The caller has checked
    /// that they are free.
    fn alloc_data(&mut self, len: usize) -> usize {
        let at = self.data_start() - len;
        debug_assert!(
            at >= meta_pos(self.count()),
            "data would overwrite KV metas"
        );
        self.set_data_start(at);
        at
    }

    /// Gives back `len` data bytes at `at` that no record references any more.
    fn release_data(&mut self, at: usize, len: usize) {
        if at == self.data_start() {
            // The bytes sit at the boundary: return them to the free space at once.
            self.set_data_start(at + len);
        } else {
            self.set_dead_bytes(self.dead_bytes() + len);
        }
    }

    /// Makes `need` contiguous free bytes available, compacting if that suffices.
    fn reserve(&mut self, need: usize) -> Result<(), WriteError> {
        let node = self.as_ref();
        if node.free_space_bytes() >= need {
            return Ok(());
        }
        if node.reclaimable_space_bytes() >= need {
            self.compact();
            return Ok(());
        }
        Err(WriteError::Full)
    }

    /// Checks that `key` belongs here and its parts fit a KV meta; returns the suffix.
    fn check_key<'k>(&self, key: &'k [u8], value: &[u8]) -> Result<&'k [u8], WriteError> {
        let node = self.as_ref();
        if !node.covers(key) {
            return Err(WriteError::OutOfRange);
        }
        let suffix = &key[node.prefix_len..];
        if suffix.len() > MAX_KEY_SUFFIX_BYTES || value.len() > MAX_VALUE_BYTES {
            return Err(WriteError::TooLarge);
        }
        Ok(suffix)
    }

    /// Writes a new record at index `i`, which the caller found by search; space for
    /// `8 + suffix + value` bytes has been reserved.
    fn place(&mut self, i: usize, suffix: &[u8], value: &[u8], t: RecordType) {
        let m = self.first() + i;
        let count = self.count();
        self.place_at(m, count, suffix, value, t);
    }

    /// [`NodeMut::place`] at KV meta `m` of a node with `count` metas.
    fn place_at(&mut self, m: usize, count: usize, suffix: &[u8], value: &[u8], t: RecordType) {
        let at = self.alloc_data(suffix.len() + value.len());
        self.buf[at..at + suffix.len()].copy_from_slice(suffix);
        self.buf[at + suffix.len()..at + suffix.len() + value.len()].copy_from_slice(value);
        self.buf
            .copy_within(meta_pos(m)..meta_pos(count), meta_pos(m + 1));
        put_meta(self.buf, m, KvMeta::new(at, suffix, value.len(), t));
        self.set_count(count + 1);
    }

    /// Inserts a record with a key the node does not hold yet; returns its index.
    ///
    /// The reference bit of the new record is clear. Compacts the node first if only the
    /// dead bytes make room. On error the node is unchanged.
    pub fn insert(&mut self, key: &[u8], value: &[u8], t: RecordType) -> Result<usize, WriteError> {
        let suffix = self.check_key(key, value)?;
        let i = match self.as_ref().search(key) {
            Ok(i) => return Err(WriteError::KeyExists(i)),
            Err(i) => i,
        };
        self.reserve(KV_META_SIZE_BYTES + suffix.len() + value.len())?;
        self.place(i, suffix, value, t);
        Ok(i)
    }

    /// Inserts the record, or replaces the value and type of the record with this key.
    ///
    /// A replacement value no longer than the old one is written into the old slot (the
    /// rest of the slot becomes dead bytes); a longer one is written to new space and the
    /// old slot becomes dead. The reference bit of an updated record is kept. On error the
    /// node is unchanged.
    pub fn upsert(
        &mut self,
        key: &[u8],
        value: &[u8],
        t: RecordType,
    ) -> Result<Upserted, WriteError> {
        let suffix = self.check_key(key, value)?;
        let i = match self.as_ref().search(key) {
            Err(i) => {
                self.reserve(KV_META_SIZE_BYTES + suffix.len() + value.len())?;
                self.place(i, suffix, value, t);
                return Ok(Upserted::Inserted(i));
            }
            Ok(i) => i,
        };
        let m = self.first() + i;
        let old = get_meta(self.buf, m);
        if value.len() <= old.value_len() {
            let v = old.offset() + old.key_len();
            self.buf[v..v + value.len()].copy_from_slice(value);
            self.set_dead_bytes(self.dead_bytes() + old.value_len() - value.len());
        } else {
            let need = suffix.len() + value.len();
            let node = self.as_ref();
            if node.reclaimable_space_bytes() + old.data_len() < need {
                return Err(WriteError::Full);
            }
            // Retire the old slot before allocating, so a compaction can reclaim it too;
            // the meta keeps its place (and look-ahead) and is rewritten below.
            put_meta(
                self.buf,
                m,
                old.with_field(KEY_LEN_SHIFT, KEY_LEN_BITS, 0).with_field(
                    VALUE_LEN_SHIFT,
                    VALUE_LEN_BITS,
                    0,
                ),
            );
            self.release_data(old.offset(), old.data_len());
            self.reserve(need)?;
            let at = self.alloc_data(need);
            self.buf[at..at + suffix.len()].copy_from_slice(suffix);
            self.buf[at + suffix.len()..at + need].copy_from_slice(value);
            put_meta(
                self.buf,
                m,
                old.with_field(OFFSET_SHIFT, OFFSET_BITS, at as u64),
            );
        }
        let cur = get_meta(self.buf, m);
        put_meta(
            self.buf,
            m,
            cur.with_field(VALUE_LEN_SHIFT, VALUE_LEN_BITS, value.len() as u64)
                .with_type(t),
        );
        Ok(Upserted::Updated(i))
    }

    fn record_meta(&self, i: usize) -> (usize, KvMeta) {
        let len = self.len();
        assert!(i < len, "record index {i} out of range 0..{len}");
        let m = self.first() + i;
        (m, get_meta(self.buf, m))
    }

    /// Sets the type of record `i`.
    pub fn set_record_type(&mut self, i: usize, t: RecordType) {
        let (m, meta) = self.record_meta(i);
        put_meta(self.buf, m, meta.with_type(t));
    }

    /// Sets or clears the reference bit of record `i`.
    pub fn set_ref_bit(&mut self, i: usize, on: bool) {
        let (m, meta) = self.record_meta(i);
        put_meta(self.buf, m, meta.with_field(REF_SHIFT, 1, u64::from(on)));
    }

    /// Clears the reference bit of every record (fence records keep theirs, which means
    /// "unbounded" there).
    pub fn clear_ref_bits(&mut self) {
        for m in self.first()..self.count() {
            let meta = get_meta(self.buf, m);
            put_meta(self.buf, m, meta.with_field(REF_SHIFT, 1, 0));
        }
    }

    /// Changes what the node is used as (for example when a mini-page that mirrors its
    /// whole leaf page is written back as the leaf page).
    pub fn set_kind(&mut self, kind: NodeKind) {
        self.buf[KIND_AT] = kind.to_byte();
    }

    /// Sets or clears the split/full flag.
    pub fn set_full_flag(&mut self, on: bool) {
        if on {
            self.buf[FLAGS_AT] |= FLAG_FULL;
        } else {
            self.buf[FLAGS_AT] &= !FLAG_FULL;
        }
    }

    /// The value of record `i`, writable in place (for example an inner node's child
    /// reference). Its length cannot change here; use [`NodeMut::upsert`] for that.
    pub fn value_mut(&mut self, i: usize) -> &mut [u8] {
        let (_, meta) = self.record_meta(i);
        &mut self.buf[meta.value_range()]
    }

    /// Removes record `i`; its data bytes become dead (or free, if they were the lowest).
    pub fn remove(&mut self, i: usize) {
        let (m, meta) = self.record_meta(i);
        let count = self.count();
        self.buf
            .copy_within(meta_pos(m + 1)..meta_pos(count), meta_pos(m));
        self.set_count(count - 1);
        self.release_data(meta.offset(), meta.data_len());
    }

    /// Removes every record, keeping the fence records.
    pub fn clear(&mut self) {
        let first = self.first();
        self.set_count(first);
        self.compact();
    }

    /// Rewrites the key/value data densely at the end of the node, in KV-meta order, so
    /// that `dead_bytes` becomes 0 and all unused bytes are contiguous free space.
    ///
    /// Uses a scratch buffer on the stack for up to 4 KiB of live data (every mini-page
    /// and leaf page) and a heap buffer beyond that.
    pub fn compact(&mut self) {
        const STACK_SCRATCH_BYTES: usize = 4096;
        let size = self.buf.len();
        let count = self.count();
        let live: usize = (0..count).map(|m| get_meta(self.buf, m).data_len()).sum();
        let mut stack = [0u8; STACK_SCRATCH_BYTES];
        let mut heap = Vec::new();
        let scratch: &mut [u8] = if live <= STACK_SCRATCH_BYTES {
            &mut stack[..live]
        } else {
            heap.resize(live, 0);
            &mut heap
        };
        // Pack the records into the scratch buffer from its end, so that the first meta's
        // data ends up highest, then copy the packed bytes to the end of the node.
        let base = size - live;
        let mut at = live;
        for m in 0..count {
            let meta = get_meta(self.buf, m);
            let len = meta.data_len();
            at -= len;
            scratch[at..at + len].copy_from_slice(&self.buf[meta.offset()..meta.offset() + len]);
            put_meta(
                self.buf,
                m,
                meta.with_field(OFFSET_SHIFT, OFFSET_BITS, (base + at) as u64),
            );
        }
        debug_assert_eq!(at, 0);
        self.buf[base..].copy_from_slice(scratch);
        self.set_data_start(base);
        self.set_dead_bytes(0);
    }

    /// Removes the records `keep` rejects and compacts the node; returns whether any was
    /// removed. Fence records, types and reference bits of the kept records stay.
    pub fn retain(&mut self, mut keep: impl FnMut(&RecordView<'_>) -> bool) -> bool {
        let node = self.as_ref();
        if node.iter().all(|r| keep(&r)) {
            return false;
        }
        let mut scratch = vec![0u8; self.buf.len()];
        bulk::copy_into(&node, &mut scratch, node.fences(), keep)
            .expect("a subset of a node fits a node of its size");
        self.buf.copy_from_slice(&scratch);
        true
    }

    /// Appends `r`, a record of a node with the same fences as this one (so the same
    /// prefix, and `r` inside them), keeping its type and reference bit: the bulk copies'
    /// path, which skips `push`'s range check and key re-encoding. The caller appends in
    /// key order (checked in debug builds).
    pub(super) fn push_same_fences(&mut self, r: &RecordView<'_>) -> Result<usize, WriteError> {
        let node = self.as_ref();
        debug_assert_eq!(
            node.prefix(),
            r.prefix(),
            "push_same_fences: another prefix"
        );
        let n = node.len();
        debug_assert!(
            n == 0 || cmp_keys(node.key_suffix(n - 1), r.suffix()) == Ordering::Less,
            "push_same_fences: keys must be strictly increasing"
        );
        let (first, count) = (node.first, node.count);
        let need = KV_META_SIZE_BYTES + r.suffix().len() + r.value().len();
        if node.free_space_bytes() < need {
            self.reserve(need)?;
        }
        self.place_at(first + n, count, r.suffix(), r.value(), r.record_type());
        if r.ref_bit() {
            let meta = get_meta(self.buf, count);
            put_meta(self.buf, count, meta.with_field(REF_SHIFT, 1, 1));
        }
        Ok(n)
    }

    /// Appends a record whose key is greater than every key in the node. Used by the
    /// bulk builders, which receive records in key order.
    ///
    /// # Panics
    ///
    /// If the key is not greater than the last record's key: the caller's input was not
    /// sorted, which is a bug.
    pub fn push(&mut self, key: &[u8], value: &[u8], t: RecordType) -> Result<usize, WriteError> {
        // Bulk builds push every record of a page, so this parses the header once and
        // compares suffixes (both keys carry the node's prefix once `covers` holds).
        let node = self.as_ref();
        if !node.covers(key) {
            return Err(WriteError::OutOfRange);
        }
        let suffix = &key[node.prefix_len..];
        if suffix.len() > MAX_KEY_SUFFIX_BYTES || value.len() > MAX_VALUE_BYTES {
            return Err(WriteError::TooLarge);
        }
        let n = node.len();
        if n > 0 {
            assert!(
                cmp_keys(node.key_suffix(n - 1), suffix) == Ordering::Less,
                "push: keys must be strictly increasing"
            );
        }
        let need = KV_META_SIZE_BYTES + suffix.len() + value.len();
        let (first, count, room) = (node.first, node.count, node.free_space_bytes() >= need);
        if !room {
            self.reserve(need)?;
        }
        self.place_at(first + n, count, suffix, value, t);
        Ok(n)
    }
}
