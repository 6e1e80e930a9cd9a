//! The value store's snapshot: the section of a checkpoint that records which extents
//! of the value file are in use, so that recovery rebuilds the allocation state without
//! reading the file. It is self-describing and versioned; the checkpoint stores its
//! bytes without reading them.
//!
//! # Layout (little-endian)
//!
//! ```text
//! magic b"BFVALUES", format version (u32, VERSION),
//! next_gen (u64), end of the address space (u64), extent count (u64),
//! per extent, by ascending offset:
//!   reference (16 bytes: offset u64, len u32, crc u32)
//!   state (u8): 1 = live, 2 = deferred (or in grace); + 0x80 if uncertain
//!   free_gen (LEB128 varint)                         deferred only
//!   owner (LEB128 varint, the keyspace id)             live only; version 2
//!   keyspace (u32), key length (varint), key           uncertain only
//! crc32c (u32) of every byte before it
//! ```
//!
//! An extent costs 18-19 bytes live (keyspace ids below 16384), 18-20 deferred, plus
//! its key while uncertain: a million large values make a snapshot of 18-25 MB.
//! Pending extents are not recorded: their records are either after the checkpoint's
//! log position (recovery replays them and marks them live) or were never
//! acknowledged. Version 1 (before owners) is still read: its live extents have no
//! owner ([`NO_OWNER`]), and a drop of their keyspace leaves them until a record
//! claims them again (the replay, an uncertain extent's settling).
//!
//! Decoding accepts any bytes and reports what is wrong as
//! [`Error::CorruptFile`](crate::error::Error::CorruptFile) (an unknown version as
//! `Incompatible`); it never panics and never allocates from a count it read.

#![deny(clippy::indexing_slicing)]

use std::path::Path;

use super::{Extent, NO_OWNER, REF_BYTES, State, ValueRef};
use crate::error::{Error, Result};
use crate::storage::IO_ALIGN_BYTES;

const MAGIC: [u8; 8] = *b"BFVALUES";
/// The snapshot format this build writes; it reads this and [`VERSION_NO_OWNERS`].
const VERSION: u32 = 2;
/// The format before live extents recorded their keyspace.
const VERSION_NO_OWNERS: u32 = 1;
const LIVE: u8 = 1;
const DEFERRED: u8 = 2;
const UNCERTAIN: u8 = 0x80;
/// Bytes before the first extent.
pub(super) const HEADER_BYTES: usize = 8 + 4 + 8 + 8 + 8;

/// An extent applied or freed while a checkpoint's window was open: the checkpoint's
/// index may or may not reference it, so recovery looks up the key and calls
/// [`ValueStore::mark_live`](super::ValueStore::mark_live) if its record references
/// `r`, else [`ValueStore::free`](super::ValueStore::free).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Uncertain {
    /// The extent.
    pub(crate) r: ValueRef,
    /// The keyspace of the record that was applied or freed.
    pub(crate) keyspace: u32,
    /// The record's key.
    pub(crate) key: Vec<u8>,
    /// Whether the window saw it freed (it is restored deferred) rather than applied
    /// (restored live).
    pub(crate) freed: bool,
}

/// A decoded snapshot: the extents in ascending order, each ending below the end, with
/// their owners ([`NO_OWNER`] for a freed one or from version 1).
#[derive(Debug)]
pub(super) struct Decoded {
    pub(super) next_gen: u64,
    pub(super) extents: Vec<(ValueRef, Extent, u32)>,
    pub(super) uncertain: Vec<Uncertain>,
}

/// The snapshot of `state`; forgets the keys of the uncertain extents (their window is
/// closed).
pub(super) fn encode(state: &mut State) -> Vec<u8> {
    let recorded = state
        .extents
        .values()
        .filter(|e| e.state != Extent::Pending)
        .count();
    let mut out = Vec::with_capacity(HEADER_BYTES + recorded * (REF_BYTES + 2) + 4);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&state.next_gen.to_le_bytes());
    out.extend_from_slice(&state.end.to_le_bytes());
    out.extend_from_slice(&(recorded as u64).to_le_bytes());
    for entry in state.extents.values_mut() {
        let uncertain = entry.uncertain.take();
        let (kind, free_gen) = match entry.state {
            Extent::Pending => continue,
            Extent::Live => (LIVE, None),
            Extent::Deferred { free_gen } | Extent::Grace { free_gen } => {
                (DEFERRED, Some(free_gen))
            }
        };
        out.extend_from_slice(&entry.r.encode());
        out.push(kind | if uncertain.is_some() { UNCERTAIN } else { 0 });
        match free_gen {
            Some(free_gen) => put_varint(&mut out, free_gen),
            None => put_varint(&mut out, u64::from(entry.owner)),
        }
        if let Some(key) = uncertain {
            out.extend_from_slice(&key.keyspace.to_le_bytes());
            put_varint(&mut out, key.key.len() as u64);
            out.extend_from_slice(&key.key);
        }
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The snapshot `bytes` (from the file `source`) encode, checked: the checksum, the
/// magic and version, every field, extents aligned, ascending, disjoint and below the
/// end, and no byte left over.
pub(super) fn decode(source: &Path, bytes: &[u8]) -> Result<Decoded> {
    let corrupt = |why: String| Error::CorruptFile {
        path: source.to_path_buf(),
        reason: format!("value store snapshot: {why}"),
    };
    let Some((body, crc)) = bytes.split_last_chunk::<4>() else {
        return Err(corrupt(format!("{} bytes is too short", bytes.len())));
    };
    if crc32c::crc32c(body) != u32::from_le_bytes(*crc) {
        return Err(corrupt("checksum mismatch".into()));
    }
    let mut r = Reader { bytes: body };
    let truncated = || corrupt("truncated".into());
    if r.take(MAGIC.len()) != Some(&MAGIC[..]) {
        return Err(corrupt("wrong magic bytes".into()));
    }
    let version = r.u32().ok_or_else(truncated)?;
    if version != VERSION && version != VERSION_NO_OWNERS {
        return Err(Error::Incompatible {
            reason: format!(
                "{}: value store snapshot format version {version}; this build reads \
                 versions {VERSION_NO_OWNERS} and {VERSION}",
                source.display()
            ),
        });
    }
    let next_gen = r.u64().ok_or_else(truncated)?;
    let end = r.u64().ok_or_else(truncated)?;
    if !end.is_multiple_of(IO_ALIGN_BYTES) {
        return Err(corrupt(format!("end {end} is not block-aligned")));
    }
    let count = r.u64().ok_or_else(truncated)?;
    let mut decoded = Decoded {
        next_gen,
        extents: Vec::new(),
        uncertain: Vec::new(),
    };
    let mut free_from = 0;
    for i in 0..count {
        let raw = r.take(REF_BYTES).ok_or_else(truncated)?;
        let v = ValueRef::decode(raw)
            .ok_or_else(|| corrupt(format!("extent {i} is not block-aligned")))?;
        let stop = v
            .extent_end()
            .filter(|&stop| stop <= end)
            .ok_or_else(|| corrupt(format!("extent {i} ({v:?}) ends past the end {end}")))?;
        if v.offset < free_from {
            return Err(corrupt(format!(
                "extent {i} ({v:?}) overlaps or precedes the one before it"
            )));
        }
        free_from = stop;
        let flags = r.u8().ok_or_else(truncated)?;
        let (state, owner) = match flags & !UNCERTAIN {
            LIVE if version == VERSION_NO_OWNERS => (Extent::Live, NO_OWNER),
            LIVE => {
                let owner = r
                    .varint()
                    .and_then(|o| u32::try_from(o).ok())
                    .ok_or_else(|| corrupt(format!("extent {i}: bad owner")))?;
                (Extent::Live, owner)
            }
            DEFERRED => (
                Extent::Deferred {
                    free_gen: r
                        .varint()
                        .ok_or_else(|| corrupt(format!("extent {i}: bad free_gen")))?,
                },
                NO_OWNER,
            ),
            other => return Err(corrupt(format!("extent {i}: unknown state {other}"))),
        };
        if flags & UNCERTAIN != 0 {
            let keyspace = r.u32().ok_or_else(truncated)?;
            let key_len = r.varint().ok_or_else(truncated)?;
            let key = usize::try_from(key_len)
                .ok()
                .and_then(|n| r.take(n))
                .ok_or_else(truncated)?;
            decoded.uncertain.push(Uncertain {
                r: v,
                keyspace,
                key: key.to_vec(),
                freed: state != Extent::Live,
            });
        }
        decoded.extents.push((v, state, owner));
    }
    if !r.bytes.is_empty() {
        return Err(corrupt(format!(
            "{} bytes after the last extent",
            r.bytes.len()
        )));
    }
    Ok(decoded)
}

/// Appends `n` as a LEB128 varint (7 bits a byte, low first).
fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Checked reading from the front of a byte slice.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.bytes.split_at_checked(n)?;
        self.bytes = rest;
        Some(taken)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }

    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    /// A LEB128 varint of at most 10 bytes that fits a u64.
    fn varint(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                return None;
            }
            n |= bits << shift;
            if b & 0x80 == 0 {
                return Some(n);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_overlong_ones_are_refused() {
        for n in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, n);
            let mut r = Reader { bytes: &b };
            assert_eq!(r.varint(), Some(n));
            assert!(r.bytes.is_empty());
        }
        // Eleven bytes, or a tenth byte with more than u64's last bit: refused.
        let mut r = Reader { bytes: &[0xff; 11] };
        assert_eq!(r.varint(), None);
        let mut over = vec![0xff; 9];
        over.push(0x02);
        assert_eq!(Reader { bytes: &over }.varint(), None);
        // Cut short.
        assert_eq!(Reader { bytes: &[0x80] }.varint(), None);
    }
}
