//! The checkpoint file's format: for each tree keyspace, its leaf pages in key order —
//! each one's low routing key and the physical page slot holding it — and the log
//! position from which recovery replays.
//!
//! # Layout (`ckpt-<generation as 16 hex digits>`, little-endian)
//!
//! ```text
//! body:
//!   magic b"BFDBCKPT"
//!   format version (u32, CHECKPOINT_VERSION)
//!   generation (u64)
//!   log position: block (u64), sequence number (u64)
//!   keyspace count (u32)
//!   per keyspace: id (u32), leaf count (u64), pages per leaf (u8, version 4 on; 1
//!                 before), per leaf: the page slot of each of its pages (u64 each),
//!                 low key length (u16), low key
//!   hash keyspace count (u32)                                  (version 2 on)
//!   per hash keyspace: id (u32); its record, encoded by `hash::checkpoint`: the hot
//!                 log's begin and tail, its index's home buckets; the cold log's
//!                 begin and tail; the chunk log's begin and tail, the chunk table's
//!                 home buckets (u64 each)
//!   value store snapshot length (u64), snapshot                (version 3 on)
//!                 (encoded by `storage::values`: the value file's extents, live and
//!                 freed, and those whose fate recovery settles by key)
//! trailer:
//!   body length (u64), crc32c of the body (u32)
//! ```
//!
//! The file is written durably by `Checkpoint::store` (in `dir.rs`); it counts only once
//! the manifest names it. Decoding accepts any bytes and reports what is wrong; it never
//! panics.

#![deny(clippy::indexing_slicing)]

use std::io::{self, Write};
use std::path::Path;

use crate::error::{Error, Result};
use crate::hash::checkpoint::{self as hash_checkpoint, F2Extents};
use crate::wal::{Cursor, LogPosition};

const MAGIC: [u8; 8] = *b"BFDBCKPT";
/// The checkpoint format this build writes. It reads this one, version 3 (before
/// leaf pages of several pages, whose leaves have one slot each), version 2 (before the
/// value store, which has no value section) and version 1 (before hash keyspaces,
/// which has no hash section either).
pub(crate) const CHECKPOINT_VERSION: u32 = 4;
const TRAILER_BYTES: usize = 12;

/// One keyspace's leaves in a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyspaceLeaves {
    pub(crate) id: u32,
    /// Each leaf's low routing key and physical page slot, in key order.
    pub(crate) leaves: Leaves,
}

/// Leaves in key order, each a low routing key and the physical page slots holding it
/// (one per 4 KiB page of the tree's leaf pages), with the keys packed in one buffer: a
/// checkpoint of a tree of millions of leaves grows three buffers instead of making an
/// allocation per leaf (which the allocator keeps after the checkpoint).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Leaves {
    /// Page slots per leaf: the tree's leaf page size in 4 KiB pages.
    pages: usize,
    /// The keys, one after another.
    keys: Vec<u8>,
    /// Where each leaf's key ends in `keys`.
    ends: Vec<usize>,
    /// Each leaf's page slots, `pages` of them, one leaf after another.
    slots: Vec<u64>,
}

impl Default for Leaves {
    fn default() -> Leaves {
        Leaves::new(1)
    }
}

impl Leaves {
    /// No leaves, of `pages` page slots each.
    pub(crate) fn new(pages: usize) -> Leaves {
        Leaves {
            pages,
            keys: Vec::new(),
            ends: Vec::new(),
            slots: Vec::new(),
        }
    }

    /// Page slots per leaf.
    pub(crate) fn pages(&self) -> usize {
        self.pages
    }

    /// Appends a leaf after the others: its low key and its first page's slot; the
    /// slots of its other pages follow with [`Leaves::push_slot`].
    pub(crate) fn push(&mut self, low: &[u8], slot: u64) {
        self.keys.extend_from_slice(low);
        self.ends.push(self.keys.len());
        self.slots.push(slot);
    }

    /// Appends the slot of the last leaf's next page.
    pub(crate) fn push_slot(&mut self, slot: u64) {
        self.slots.push(slot);
    }

    /// Forgets every leaf (their memory is kept for the next).
    pub(crate) fn clear(&mut self) {
        self.keys.clear();
        self.ends.clear();
        self.slots.clear();
    }

    /// How many leaves.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// The page slots, in key order, each leaf's `pages` in a row.
    pub(crate) fn slots(&self) -> &[u64] {
        &self.slots
    }

    /// (low key, page slots) of each leaf, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u64])> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .zip(self.slots.chunks(self.pages.max(1)))
            .map(|((start, &end), slots)| (self.keys.get(start..end).unwrap_or_default(), slots))
    }
}

impl<'a> FromIterator<(&'a [u8], u64)> for Leaves {
    fn from_iter<I: IntoIterator<Item = (&'a [u8], u64)>>(iter: I) -> Leaves {
        let mut leaves = Leaves::default();
        for (low, slot) in iter {
            leaves.push(low, slot);
        }
        leaves
    }
}

/// A decoded checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub(crate) generation: u64,
    pub(crate) position: LogPosition,
    pub(crate) keyspaces: Vec<KeyspaceLeaves>,
    /// Each hash keyspace's logs, by keyspace id.
    pub(crate) hash: Vec<(u32, F2Extents)>,
    /// The value store's snapshot (`ValueStore::snapshot`); empty in a checkpoint of a
    /// version before 3, whose database held no value out of line.
    pub(crate) values: Vec<u8>,
}

impl Checkpoint {
    /// The file's bytes, as one buffer (tests and the fuzz target; files are written
    /// with [`Checkpoint::store`]).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        self.write_to(&mut b).expect("writing to a Vec");
        b
    }

    /// Writes the file's bytes to `out`, a piece at a time (no copy of the whole file
    /// is built: a tree of millions of leaves has a checkpoint of tens of MiB).
    pub(super) fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        let mut w = Summed {
            out,
            len: 0,
            crc: 0,
        };
        w.put(&MAGIC)?;
        w.put(&CHECKPOINT_VERSION.to_le_bytes())?;
        w.put(&self.generation.to_le_bytes())?;
        w.put(&self.position.block.to_le_bytes())?;
        w.put(&self.position.seq.to_le_bytes())?;
        w.put(&(self.keyspaces.len() as u32).to_le_bytes())?;
        for ks in &self.keyspaces {
            w.put(&ks.id.to_le_bytes())?;
            w.put(&(ks.leaves.len() as u64).to_le_bytes())?;
            w.put(&[ks.leaves.pages() as u8])?;
            for (low, slots) in ks.leaves.iter() {
                for slot in slots {
                    w.put(&slot.to_le_bytes())?;
                }
                w.put(&(low.len() as u16).to_le_bytes())?;
                w.put(low)?;
            }
        }
        w.put(&(self.hash.len() as u32).to_le_bytes())?;
        for (id, extents) in &self.hash {
            w.put(&id.to_le_bytes())?;
            w.put(&extents.encode())?;
        }
        w.put(&(self.values.len() as u64).to_le_bytes())?;
        w.put(&self.values)?;
        let (len, crc) = (w.len, w.crc);
        out.write_all(&len.to_le_bytes())?;
        out.write_all(&crc.to_le_bytes())
    }

    /// Decodes the checkpoint file at `path`.
    pub(crate) fn decode(path: &Path, bytes: &[u8]) -> Result<Checkpoint> {
        let corrupt = |reason: String| Error::CorruptFile {
            path: path.to_path_buf(),
            reason,
        };
        let split = bytes.len().checked_sub(TRAILER_BYTES).ok_or_else(|| {
            corrupt(format!(
                "{} bytes is too short for a checkpoint",
                bytes.len()
            ))
        })?;
        let (body, trailer) = (
            bytes.get(..split).unwrap_or_default(),
            bytes.get(split..).unwrap_or_default(),
        );
        let mut t = Cursor { bytes: trailer };
        let (len, crc) = match (t.u64(), t.u32()) {
            (Some(len), Some(crc)) => (len, crc),
            _ => return Err(corrupt("truncated trailer".into())),
        };
        if len != body.len() as u64 {
            return Err(corrupt(format!(
                "the trailer gives a {len}-byte body; the file holds {} (truncated?)",
                body.len()
            )));
        }
        if crc32c::crc32c(body) != crc {
            return Err(corrupt("checksum mismatch".into()));
        }
        let mut r = Cursor { bytes: body };
        if r.take(MAGIC.len()) != Some(&MAGIC[..]) {
            return Err(corrupt("not a bfdb checkpoint (wrong magic bytes)".into()));
        }
        let truncated = || corrupt("truncated body".into());
        let version = r.u32().ok_or_else(truncated)?;
        if !(1..=CHECKPOINT_VERSION).contains(&version) {
            return Err(Error::Incompatible {
                reason: format!(
                    "{} is checkpoint format version {version}; this build reads versions \
                     1 to {CHECKPOINT_VERSION}",
                    path.display()
                ),
            });
        }
        let generation = r.u64().ok_or_else(truncated)?;
        let position = LogPosition {
            block: r.u64().ok_or_else(truncated)?,
            seq: r.u64().ok_or_else(truncated)?,
        };
        let count = r.u32().ok_or_else(truncated)?;
        let mut keyspaces = Vec::new();
        for _ in 0..count {
            let id = r.u32().ok_or_else(truncated)?;
            let leaves_count = r.u64().ok_or_else(truncated)?;
            // Version 4 gives the pages per leaf; before, leaves were one page.
            let pages = if version >= 4 {
                r.u8().ok_or_else(truncated)?
            } else {
                1
            };
            if ![1, 2, 4, 8].contains(&pages) {
                return Err(corrupt(format!(
                    "keyspace {id} has leaves of {pages} pages; 1, 2, 4 or 8 are known"
                )));
            }
            // No capacity from the count: a damaged one could claim anything.
            let mut leaves = Leaves::new(usize::from(pages));
            let mut slots = Vec::with_capacity(usize::from(pages));
            for _ in 0..leaves_count {
                slots.clear();
                for _ in 0..pages {
                    slots.push(r.u64().ok_or_else(truncated)?);
                }
                let len = usize::from(r.u16().ok_or_else(truncated)?);
                let low = r.take(len).ok_or_else(truncated)?;
                let (&first, rest) = slots.split_first().ok_or_else(truncated)?;
                leaves.push(low, first);
                for &slot in rest {
                    leaves.push_slot(slot);
                }
            }
            keyspaces.push(KeyspaceLeaves { id, leaves });
        }
        let mut hash = Vec::new();
        if version >= 2 {
            let count = r.u32().ok_or_else(truncated)?;
            for _ in 0..count {
                let id = r.u32().ok_or_else(truncated)?;
                let extents = r
                    .take(hash_checkpoint::ENCODED_BYTES)
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(truncated)?;
                hash.push((id, F2Extents::decode(extents)));
            }
        }
        let mut values = Vec::new();
        if version >= 3 {
            let len = r.u64().ok_or_else(truncated)?;
            let len = usize::try_from(len).map_err(|_| truncated())?;
            values = r.take(len).ok_or_else(truncated)?.to_vec();
        }
        if !r.bytes.is_empty() {
            return Err(corrupt(format!(
                "{} bytes after the last keyspace",
                r.bytes.len()
            )));
        }
        Ok(Checkpoint {
            generation,
            position,
            keyspaces,
            hash,
            values,
        })
    }
}

/// A writer that passes bytes on and keeps their count and crc32c (the body's trailer).
struct Summed<'a, W: Write> {
    out: &'a mut W,
    len: u64,
    crc: u32,
}

impl<W: Write> Summed<'_, W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.len += bytes.len() as u64;
        self.out.write_all(bytes)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            generation: 9,
            position: LogPosition {
                block: 77,
                seq: 1234,
            },
            keyspaces: vec![
                KeyspaceLeaves {
                    id: 1,
                    leaves: [(&b""[..], 5), (b"m", 9), (&b"t".repeat(300)[..], 2)]
                        .into_iter()
                        .collect(),
                },
                KeyspaceLeaves {
                    id: 4,
                    leaves: [(&b""[..], 3)].into_iter().collect(),
                },
            ],
            hash: vec![(5, {
                let numbers = [64u64, 9000, 1024, 64, 4096, 128, 70000, 256];
                let bytes: Vec<u8> = numbers.iter().flat_map(|n| n.to_le_bytes()).collect();
                F2Extents::decode(&bytes.try_into().unwrap())
            })],
            values: b"a value store's snapshot".to_vec(),
        }
    }

    #[test]
    fn round_trips_and_every_truncation_or_flip_is_refused() {
        let c = sample();
        let bytes = c.encode();
        assert_eq!(Checkpoint::decode(Path::new("C"), &bytes).unwrap(), c);
        for len in 0..bytes.len() {
            assert!(
                Checkpoint::decode(Path::new("C"), &bytes[..len]).is_err(),
                "{len}"
            );
        }
        for bit in (0..bytes.len() * 8).step_by(7) {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(Checkpoint::decode(Path::new("C"), &b).is_err(), "bit {bit}");
        }
    }
}
