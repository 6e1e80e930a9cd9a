//! Rebuilding nodes from records: growth, copy-on-access, merges and splits.
//!
//! Each helper formats a fresh destination buffer and appends records in key order, so
//! the result is compact (no dead bytes) and each record costs one append, no search.

use super::{Fences, NodeKind, NodeMut, NodeRef, RecordType, RecordView, WriteError};

/// Appends records `range` of `src` to `dst`, keeping type and reference bit.
fn append_records(
    src: &NodeRef<'_>,
    range: std::ops::Range<usize>,
    dst: &mut NodeMut<'_>,
    mut filter: impl FnMut(&RecordView<'_>) -> bool,
) -> Result<(), WriteError> {
    // Same fences (growth, copy-on-access, compacting a merged page): every record of
    // `src` lies inside them and keeps its stored suffix, so it is appended as stored.
    if dst.as_ref().fences() == src.fences() {
        for r in src.iter_from(range.start).take(range.len()) {
            if filter(&r) {
                dst.push_same_fences(&r)?;
            }
        }
        return Ok(());
    }
    let mut key = Vec::new();
    for r in src.iter_from(range.start).take(range.len()) {
        if !filter(&r) {
            continue;
        }
        r.key_into(&mut key);
        let i = dst.push(&key, r.value(), r.record_type())?;
        if r.ref_bit() {
            dst.set_ref_bit(i, true);
        }
    }
    Ok(())
}

/// Rebuilds into `dst_buf` a node of `src`'s kind covering `fences`, holding the records
/// of `src` for which `filter` returns true (with their types and reference bits).
///
/// Used to grow a mini-page (`dst_buf` twice the size, `src.fences()`, keep all), for
/// copy-on-access (keep records whose reference bit is set) and as the first step of a
/// merge. Fails with [`WriteError::Full`] if the kept records do not fit, with
/// [`WriteError::OutOfRange`] if one lies outside `fences`, and with
/// [`WriteError::Init`] if `fences` cannot be set up in `dst_buf`.
pub fn copy_into<'d>(
    src: &NodeRef<'_>,
    dst_buf: &'d mut [u8],
    fences: Fences<'_>,
    filter: impl FnMut(&RecordView<'_>) -> bool,
) -> Result<NodeMut<'d>, WriteError> {
    let mut dst = NodeMut::init(dst_buf, src.kind(), fences).map_err(WriteError::Init)?;
    append_records(src, 0..src.len(), &mut dst, filter)?;
    Ok(dst)
}

/// Builds a node in `buf` from records given in strictly increasing key order. Each
/// record is `(full key, value, type)`; reference bits start clear.
///
/// # Panics
///
/// If the keys are not strictly increasing (a bug in the caller).
pub fn build_sorted<'d, K, V>(
    buf: &'d mut [u8],
    kind: NodeKind,
    fences: Fences<'_>,
    records: impl IntoIterator<Item = (K, V, RecordType)>,
) -> Result<NodeMut<'d>, WriteError>
where
    K: AsRef<[u8]>,
    V: AsRef<[u8]>,
{
    let mut node = NodeMut::init(buf, kind, fences).map_err(WriteError::Init)?;
    for (k, v, t) in records {
        node.push(k.as_ref(), v.as_ref(), t)?;
    }
    Ok(node)
}

/// Splits `src` into two nodes of its kind, in `left_buf` and `right_buf`, and returns
/// the separator key: the full key of the first record of the right half.
///
/// The split point is where the records' bytes (KV meta, stored key and value) reach half
/// of their total, with at least one record on each side. Every record with a key below
/// the separator goes left, every other record right. With [`Fences::Range`] the left
/// node gets fences `(low, separator)` and the right node `(separator, high)`, so each
/// may get a longer prefix than `src`; with [`Fences::Prefix`] or [`Fences::None`] both
/// halves keep `src`'s fences. Types and reference bits are kept; the full flags are
/// clear.
///
/// # Panics
///
/// If `src` has fewer than two records.
pub fn split(
    src: &NodeRef<'_>,
    left_buf: &mut [u8],
    right_buf: &mut [u8],
) -> Result<Vec<u8>, WriteError> {
    let n = src.len();
    assert!(n >= 2, "split needs at least two records, the node has {n}");
    let cost = |r: &RecordView<'_>| super::KV_META_SIZE_BYTES + r.suffix().len() + r.value().len();
    let total: usize = src.iter().map(|r| cost(&r)).sum();
    let mut acc = 0;
    let mut at = n - 1;
    for (i, r) in src.iter().enumerate() {
        if i > 0 && 2 * acc >= total {
            at = i;
            break;
        }
        acc += cost(&r);
    }
    let at = at.clamp(1, n - 1);
    let separator = src.record(at).key();
    let (left_fences, right_fences) = match src.fences() {
        Fences::Range { low, high } => (
            Fences::Range {
                low,
                high: Some(&separator),
            },
            Fences::Range {
                low: Some(&separator),
                high,
            },
        ),
        other => (other, other),
    };
    let mut left = NodeMut::init(left_buf, src.kind(), left_fences).map_err(WriteError::Init)?;
    append_records(src, 0..at, &mut left, |_| true)?;
    let mut right = NodeMut::init(right_buf, src.kind(), right_fences).map_err(WriteError::Init)?;
    append_records(src, at..n, &mut right, |_| true)?;
    Ok(separator)
}
