//! Full validation of node bytes of unknown origin (a leaf page read from disk).
//!
//! Every check reads only bytes whose position an earlier check has proven in bounds, so
//! validation itself cannot panic, and once it passes no accessor of [`NodeRef`] can
//! index out of bounds.
//!
//! Bytes are read here only through checked access (`byte`, `bytes`, `get`), so a
//! bound this module forgot to prove becomes a validation error, not a panic; the
//! module denies `clippy::indexing_slicing` to keep it that way. Validation is a
//! loop over the records, never recursion.
//!
//! [`NodeRef`]: super::NodeRef

#![deny(clippy::indexing_slicing)]

use std::cmp::Ordering;
use std::ops::Range;

use super::{
    COUNT_AT, DATA_START_AT, DEAD_BYTES_AT, FENCE_ROLE_HIGH, FENCE_ROLE_LOW, FENCE_ROLE_PREFIX,
    FLAG_HAS_FENCES, FLAG_HAS_PREFIX_RECORD, FLAGS_AT, FLAGS_KNOWN, KIND_AT, KV_META_SIZE_BYTES,
    KvMeta, MAX_NODE_SIZE_BYTES, MIN_NODE_SIZE_BYTES, NODE_META_SIZE_BYTES, NODE_SIZE_AT,
    NodeError, NodeKind, PREFIX_LEN_AT, RESERVED_AT, RESERVED_LEN, cmp_concat, cmp_keys,
    common_prefix_len, get_meta, get_u16, look_ahead,
};

/// Words of the "byte in use" bitmap: one bit per byte of the largest node.
const USED_WORDS: usize = MAX_NODE_SIZE_BYTES / 64;

/// Marks `range` in the bitmap; fails if any of its bytes was already marked.
fn mark_used(used: &mut [u64; USED_WORDS], start: usize, end: usize) -> bool {
    let mut at = start;
    while at < end {
        let word = at / 64;
        let bit = at % 64;
        let n = (64 - bit).min(end - at);
        let mask = if n == 64 {
            u64::MAX
        } else {
            ((1u64 << n) - 1) << bit
        };
        // `end <= MAX_NODE_SIZE_BYTES`, so `word < USED_WORDS`; a word out of range would
        // be a bound this module failed to prove, reported as an overlap.
        let Some(slot) = used.get_mut(word) else {
            return false;
        };
        if *slot & mask != 0 {
            return false;
        }
        *slot |= mask;
        at += n;
    }
    true
}

fn err<T>(reason: impl Into<String>) -> Result<T, NodeError> {
    Err(NodeError::new(reason))
}

/// The byte at `at` of `buf`, or an error if it lies outside.
fn byte(buf: &[u8], at: usize) -> Result<u8, NodeError> {
    match buf.get(at) {
        Some(&b) => Ok(b),
        None => err(format!(
            "byte {at} lies outside the {}-byte node",
            buf.len()
        )),
    }
}

/// The bytes at `range` of `buf`, or an error if they lie outside.
fn bytes(buf: &[u8], range: Range<usize>) -> Result<&[u8], NodeError> {
    match buf.get(range.clone()) {
        Some(b) => Ok(b),
        None => err(format!(
            "bytes {}..{} lie outside the {}-byte node",
            range.start,
            range.end,
            buf.len()
        )),
    }
}

/// Checks every invariant of the node layout on `buf`.
///
/// Long (about 170 lines) by choice: one check per invariant, in the order of the layout
/// (meta, record table, fences and prefix, records, order), each relying on the ones
/// before it for the ranges it reads. Split into pieces, each piece would have to carry
/// or re-check what the earlier ones established.
pub(super) fn validate(buf: &[u8]) -> Result<(), NodeError> {
    let size = buf.len();
    if !(MIN_NODE_SIZE_BYTES..=MAX_NODE_SIZE_BYTES).contains(&size) {
        return err(format!(
            "buffer of {size} bytes outside {MIN_NODE_SIZE_BYTES}..={MAX_NODE_SIZE_BYTES}"
        ));
    }
    // The header is in bounds from here on: size >= 16.
    let stored_size = usize::from(get_u16(buf, NODE_SIZE_AT));
    if stored_size != size {
        return err(format!(
            "node size field {stored_size} != buffer length {size}"
        ));
    }
    let kind = byte(buf, KIND_AT)?;
    if NodeKind::from_byte(kind).is_none() {
        return err(format!("unknown node kind {kind}"));
    }
    let flags = byte(buf, FLAGS_AT)?;
    if flags & !FLAGS_KNOWN != 0 {
        return err(format!("unknown flag bits {flags:#04x}"));
    }
    if bytes(buf, RESERVED_AT..RESERVED_AT + RESERVED_LEN)? != [0; RESERVED_LEN] {
        return err("reserved header bytes are not zero");
    }
    let has_fences = flags & FLAG_HAS_FENCES != 0;
    let has_prefix_record = flags & FLAG_HAS_PREFIX_RECORD != 0;
    if has_fences && has_prefix_record {
        return err("both fence keys and a prefix record are flagged");
    }
    let first = if has_fences {
        2
    } else if has_prefix_record {
        1
    } else {
        0
    };

    let count = usize::from(get_u16(buf, COUNT_AT));
    let data_start = usize::from(get_u16(buf, DATA_START_AT));
    let prefix_len = usize::from(get_u16(buf, PREFIX_LEN_AT));
    let dead = usize::from(get_u16(buf, DEAD_BYTES_AT));
    if count < first {
        return err(format!(
            "{count} KV metas but {first} fence records flagged"
        ));
    }
    // count <= u16::MAX, so this cannot overflow.
    let meta_end = NODE_META_SIZE_BYTES + count * KV_META_SIZE_BYTES;
    if meta_end > data_start {
        return err(format!(
            "{count} KV metas end at {meta_end}, past data start {data_start}"
        ));
    }
    if data_start > size {
        return err(format!("data start {data_start} past node size {size}"));
    }

    // Per-meta checks: bounds, look-ahead, fence flags and roles. Disjointness is
    // proven cheaply when the records' bytes lie in offset order (as every node the
    // bulk helpers build has them); otherwise a bitmap pass below proves it.
    let mut live = 0usize;
    let mut descending = true;
    let mut ascending = true;
    let (mut prev_off, mut prev_end) = (0usize, 0usize);
    let mut prev_nonempty = false;
    for m in 0..count {
        let meta = get_meta(buf, m);
        let (off, end) = (meta.offset(), meta.offset() + meta.data_len());
        // A record without bytes owns none, so only its end matters: removing the record
        // below it may have moved data_start past its offset.
        if (off < data_start && end > off) || end > size {
            return err(format!(
                "KV meta {m}: bytes {off}..{end} outside the data region {data_start}..{size}"
            ));
        }
        if end > off {
            if prev_nonempty {
                descending &= end <= prev_off;
                ascending &= off >= prev_end;
            }
            (prev_off, prev_end, prev_nonempty) = (off, end, true);
        }
        live += meta.data_len();
        if look_ahead(bytes(buf, meta.key_range())?) != meta.look_ahead() {
            return err(format!("KV meta {m}: look-ahead does not match the key"));
        }
        if meta.is_fence() != (m < first) {
            return err(format!(
                "KV meta {m}: fence flag where none belongs, or missing"
            ));
        }
        if m < first {
            check_fence_meta(m, meta, has_fences)?;
        } else if meta.is_external() && (kind == NodeKind::Inner.to_byte() || meta.type_bits() > 1)
        {
            return err(format!(
                "KV meta {m}: an out-of-line value on a record that holds none"
            ));
        }
    }
    if !descending && !ascending {
        check_disjoint(buf, count)?;
    }
    if live + dead != size - data_start {
        return err(format!(
            "dead bytes {dead} + live bytes {live} != data region of {} bytes",
            size - data_start
        ));
    }

    // Fences and prefix.
    let key = |m: usize| bytes(buf, get_meta(buf, m).key_range());
    let bounded = |m: usize| !get_meta(buf, m).ref_bit();
    let prefix: &[u8] = if has_fences {
        let expected = if bounded(0) && bounded(1) {
            if key(0)? >= key(1)? {
                return err("low fence key is not below the high fence key");
            }
            common_prefix_len(key(0)?, key(1)?)
        } else {
            0
        };
        if prefix_len != expected {
            return err(format!(
                "prefix length {prefix_len}, but the fence keys share {expected} bytes"
            ));
        }
        // `expected` is a common prefix of the low fence key, or 0.
        bytes(key(0)?, 0..prefix_len)?
    } else if has_prefix_record {
        let record = key(0)?;
        if prefix_len != record.len() {
            return err(format!(
                "prefix length {prefix_len} != prefix record length {}",
                record.len()
            ));
        }
        record
    } else {
        if prefix_len != 0 {
            return err(format!("prefix length {prefix_len} without fence records"));
        }
        &[]
    };

    // Records: strictly increasing, inside the fences. Sharing the prefix is implied by
    // how keys are stored; the fences are compared with prefix ++ suffix.
    // Look-aheads were checked against the keys above, and they order unequal values
    // like the keys do, so only equal look-aheads need the bytes compared.
    let mut prev = None;
    for m in first..count {
        let meta = get_meta(buf, m);
        if let Some(p) = prev {
            let p: KvMeta = p;
            let ordered = match p.look_ahead().cmp(&meta.look_ahead()) {
                Ordering::Less => true,
                Ordering::Greater => false,
                Ordering::Equal => {
                    cmp_keys(bytes(buf, p.key_range())?, bytes(buf, meta.key_range())?)
                        == Ordering::Less
                }
            };
            if !ordered {
                return err(format!(
                    "record {} is not above record {}",
                    m - first,
                    m - first - 1
                ));
            }
        }
        prev = Some(meta);
    }
    if has_fences && count > first {
        if bounded(0) && cmp_concat(prefix, key(first)?, key(0)?) == Ordering::Less {
            return err("first record lies below the low fence");
        }
        if bounded(1) && cmp_concat(prefix, key(count - 1)?, key(1)?) != Ordering::Less {
            return err("last record lies at or above the high fence");
        }
    }
    Ok(())
}

/// Proves that no two records' bytes overlap, with a bitmap of the node's bytes.
fn check_disjoint(buf: &[u8], count: usize) -> Result<(), NodeError> {
    let mut used = [0u64; USED_WORDS];
    for m in 0..count {
        let meta = get_meta(buf, m);
        let (off, end) = (meta.offset(), meta.offset() + meta.data_len());
        if !mark_used(&mut used, off, end) {
            return err(format!(
                "KV meta {m}: bytes {off}..{end} overlap another record"
            ));
        }
    }
    Ok(())
}

fn check_fence_meta(m: usize, meta: KvMeta, has_fences: bool) -> Result<(), NodeError> {
    if meta.value_len() != 0 || meta.is_external() {
        return err(format!("fence record {m} has a value"));
    }
    let expected_role = match (has_fences, m) {
        (true, 0) => FENCE_ROLE_LOW,
        (true, _) => FENCE_ROLE_HIGH,
        (false, _) => FENCE_ROLE_PREFIX,
    };
    if meta.type_bits() != expected_role {
        return err(format!(
            "fence record {m} has role {}, expected {expected_role}",
            meta.type_bits()
        ));
    }
    if meta.ref_bit() && (!has_fences || meta.key_len() != 0) {
        // Only fence keys can be unbounded, and an unbounded fence stores no key.
        return err(format!(
            "fence record {m} is marked unbounded but is not empty"
        ));
    }
    Ok(())
}
