//! The manifest's format: the database directory's catalog of keyspaces, in one small
//! file replaced atomically.
//!
//! # Layout (`MANIFEST`, little-endian)
//!
//! ```text
//! 0..8    magic b"BFDBMANI"
//! 8..12   format version (u32, MANIFEST_VERSION)
//! 12..16  crc32c of the body
//! 16..20  body length in bytes (u32)
//! 20..    body:
//!           next keyspace id (u32)
//!           largest key and value a write may have had (u32, u32): the options'
//!             limits when written, never lowered
//!           keyspace count (u32)
//!           per keyspace, in name order (bytewise): id (u32), kind (u8: 1 = tree of 4 KiB leaf pages, 5 = tree
//!                         of larger ones, 2, 3 or 4 = hash store), name length (u16),
//!                         name (UTF-8); for kind 5 the 4 KiB pages per leaf (u8: 2, 4
//!                         or 8); and for a hash store its layout:
//!                         memory bytes, expected keys, hot and cold log disk bytes
//!                         (u64 each), compaction threads (u16), log2 of the page size
//!                         of the hot, cold and chunk logs (u8 each); kind 3 then has
//!                         the memory parts set instead of the paper's shares (hot
//!                         index, read cache, cold log, chunk log: u64 each, all ones
//!                         for a share). Kind 2 (written before the parts existed) is
//!                         read as kind 3 with every part a share. Kind 4 is kind 3
//!                         whose log records carry checksums (record format 2); a
//!                         store of kind 2 or 3 (format 1) is refused when opened, and
//!                         its entry is written back as it was.
//!           checkpoint count (u8, at most 2), newest first
//!           per checkpoint: generation (u64, at most 2^62), log position block (u64) and sequence
//!                           number (u64), and the log's durable end when it committed
//!                           (u64: every record below this sequence number was durable)
//! ```
//!
//! Version 1 (written before the durable end was recorded) is still read: its
//! checkpoints' durable ends are their positions, so recovery demands no log past them.
//!
//! The manifest is the database's commit point: a checkpoint counts once the manifest
//! names it. Two are kept, so that recovery can fall back to the older one if the newer
//! one's file is damaged; the log is kept from the older one's position.
//!
//! A new manifest replaces the old one atomically (`Manifest::store`, in `dir.rs`). A
//! keyspace id is never reused, so log records of a dropped keyspace can never be
//! replayed into a new one of the same name.
//!
//! Decoding accepts any bytes and reports what is wrong; it never panics.

#![deny(clippy::indexing_slicing)]

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;

use crate::error::{Error, Result};
use crate::hash::f2::ColdLayout;
use crate::hash::store::{HashLayout, HashStoreOptions, RECORD_FORMAT};
use crate::wal::{Cursor, LogPosition};

const MAGIC: [u8; 8] = *b"BFDBMANI";
/// The manifest format this build reads and writes.
pub(crate) const MANIFEST_VERSION: u32 = 2;
/// The oldest manifest format this build reads (and rewrites as the current one).
const OLDEST_READABLE_VERSION: u32 = 1;
const HEADER_BYTES: usize = 20;
/// The longest keyspace name, in bytes.
pub(crate) const MAX_NAME_BYTES: usize = 255;
/// A hash layout's part that is the paper's share, not a number of bytes.
const NO_PART: u64 = u64::MAX;

/// The kind of index a keyspace is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyspaceKind {
    /// An ordered [`Tree`](crate::Tree) whose leaf pages are `leaf_pages` 4 KiB pages
    /// (`Config::leaf_page_size_bytes`).
    Tree { leaf_pages: u8 },
    /// A [`HashStore`](crate::HashStore) of this layout.
    Hash(HashLayout),
}

impl KeyspaceKind {
    fn code(&self) -> u8 {
        match self {
            // Kind 1 is a tree of 4 KiB leaf pages, as every build wrote it; kind 5
            // adds the pages per leaf.
            KeyspaceKind::Tree { leaf_pages: 1 } => 1,
            KeyspaceKind::Tree { .. } => 5,
            // Kind 6: a hash store whose cold tier is runs (`ColdLayout::Runs`).
            KeyspaceKind::Hash(layout)
                if layout.record_format == RECORD_FORMAT
                    && layout.options.cold_layout == ColdLayout::Runs =>
            {
                6
            }
            KeyspaceKind::Hash(layout) if layout.record_format == RECORD_FORMAT => 4,
            // An entry of an earlier build keeps its kind: its files keep their format.
            KeyspaceKind::Hash(_) => 3,
        }
    }
}

/// One keyspace of the catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyspaceEntry {
    pub(crate) id: u32,
    pub(crate) kind: KeyspaceKind,
}

/// A checkpoint the manifest names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CheckpointRef {
    pub(crate) generation: u64,
    /// Where recovery from it starts reading the log.
    pub(crate) position: LogPosition,
    /// The sequence number of the first record that was not durable when it committed:
    /// the log held every record from `position` up to here, and a recovery from this
    /// checkpoint, or from an older one, must find all of them.
    pub(crate) log_end_seq: u64,
}

/// The largest checkpoint generation a manifest names: far beyond any database's
/// life, and far enough below `u64::MAX` that the next ones never overflow.
pub(crate) const MAX_GENERATION: u64 = 1 << 62;

/// Checkpoints a manifest names at most: the newest and the one before, to fall back to.
pub(crate) const KEPT_CHECKPOINTS: usize = 2;

/// The decoded manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Manifest {
    /// The id the next keyspace gets.
    pub(crate) next_id: u32,
    /// Keyspaces by name.
    pub(crate) keyspaces: BTreeMap<String, KeyspaceEntry>,
    /// The committed checkpoints, newest first, at most [`KEPT_CHECKPOINTS`].
    pub(crate) checkpoints: Vec<CheckpointRef>,
    /// The largest key and value limits the database was ever opened with: its data
    /// may hold keys and values that long.
    pub(crate) max_key_bytes: u32,
    pub(crate) max_value_bytes: u32,
}

impl Default for Manifest {
    fn default() -> Self {
        Manifest {
            next_id: 1,
            keyspaces: BTreeMap::new(),
            checkpoints: Vec::new(),
            max_key_bytes: 0,
            max_value_bytes: 0,
        }
    }
}

impl Manifest {
    /// The manifest's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&self.next_id.to_le_bytes());
        body.extend_from_slice(&self.max_key_bytes.to_le_bytes());
        body.extend_from_slice(&self.max_value_bytes.to_le_bytes());
        body.extend_from_slice(&(self.keyspaces.len() as u32).to_le_bytes());
        for (name, entry) in &self.keyspaces {
            body.extend_from_slice(&entry.id.to_le_bytes());
            body.push(entry.kind.code());
            body.extend_from_slice(&(name.len() as u16).to_le_bytes());
            body.extend_from_slice(name.as_bytes());
            if let KeyspaceKind::Tree { leaf_pages } = entry.kind
                && leaf_pages != 1
            {
                body.push(leaf_pages);
            }
            if let KeyspaceKind::Hash(layout) = &entry.kind {
                let o = &layout.options;
                for n in [
                    layout.memory_bytes(),
                    o.expected_keys,
                    o.hot_log_disk_bytes,
                    o.cold_log_disk_bytes,
                ] {
                    body.extend_from_slice(&n.to_le_bytes());
                }
                body.extend_from_slice(&(o.compaction_threads as u16).to_le_bytes());
                body.extend_from_slice(&layout.page_bits);
                // Kind 3 adds the parts set instead of the paper's shares (`NO_PART`
                // for a share).
                for part in o.parts() {
                    body.extend_from_slice(&part.unwrap_or(NO_PART).to_le_bytes());
                }
            }
        }
        body.push(self.checkpoints.len() as u8);
        for c in &self.checkpoints {
            body.extend_from_slice(&c.generation.to_le_bytes());
            body.extend_from_slice(&c.position.block.to_le_bytes());
            body.extend_from_slice(&c.position.seq.to_le_bytes());
            body.extend_from_slice(&c.log_end_seq.to_le_bytes());
        }
        let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes a manifest read from `path`; any fault is an error naming the file.
    pub(crate) fn decode(path: &Path, bytes: &[u8]) -> Result<Manifest> {
        let corrupt = |reason: String| Error::CorruptFile {
            path: path.to_path_buf(),
            reason,
        };
        let mut r = Cursor { bytes };
        let magic = r
            .take(MAGIC.len())
            .ok_or_else(|| corrupt(format!("{} bytes is too short for a manifest", bytes.len())))?;
        if magic != MAGIC {
            return Err(corrupt("not a bfdb manifest (wrong magic bytes)".into()));
        }
        let version = r.u32().ok_or_else(|| corrupt("truncated header".into()))?;
        if !(OLDEST_READABLE_VERSION..=MANIFEST_VERSION).contains(&version) {
            return Err(Error::Incompatible {
                reason: format!(
                    "{} is manifest format version {version}; this build reads versions \
                     {OLDEST_READABLE_VERSION} to {MANIFEST_VERSION}",
                    path.display()
                ),
            });
        }
        let (crc, len) = match (r.u32(), r.u32()) {
            (Some(crc), Some(len)) => (crc, len as usize),
            _ => return Err(corrupt("truncated header".into())),
        };
        let body = r.take(len).ok_or_else(|| {
            corrupt(format!(
                "the header promises a {len}-byte body; the file holds {}",
                bytes.len().saturating_sub(HEADER_BYTES)
            ))
        })?;
        if !r.bytes.is_empty() {
            return Err(corrupt(format!("{} bytes after the body", r.bytes.len())));
        }
        if crc32c::crc32c(body) != crc {
            return Err(corrupt("checksum mismatch".into()));
        }
        Self::decode_body(body, version).map_err(corrupt)
    }

    fn decode_body(body: &[u8], version: u32) -> std::result::Result<Manifest, String> {
        let truncated = || "truncated body".to_string();
        let mut r = Cursor { bytes: body };
        let next_id = r.u32().ok_or_else(truncated)?;
        let max_key_bytes = r.u32().ok_or_else(truncated)?;
        let max_value_bytes = r.u32().ok_or_else(truncated)?;
        let count = r.u32().ok_or_else(truncated)?;
        let mut keyspaces = BTreeMap::new();
        for _ in 0..count {
            let id = r.u32().ok_or_else(truncated)?;
            let code = r.u8().ok_or_else(truncated)?;
            let len = usize::from(r.u16().ok_or_else(truncated)?);
            let name = std::str::from_utf8(r.take(len).ok_or_else(truncated)?)
                .map_err(|_| format!("keyspace {id}'s name is not UTF-8"))?;
            let kind = match code {
                1 => KeyspaceKind::Tree { leaf_pages: 1 },
                5 => {
                    // One page per leaf is kind 1: every build writes it so, and a
                    // manifest decodes to what encodes back to its bytes.
                    let leaf_pages = r.u8().ok_or_else(truncated)?;
                    if ![2, 4, 8].contains(&leaf_pages) {
                        return Err(format!(
                            "keyspace {name:?} of kind 5 has leaf pages of {leaf_pages} pages; \
                             2, 4 or 8 are known (a tree of one-page leaves is kind 1)"
                        ));
                    }
                    KeyspaceKind::Tree { leaf_pages }
                }
                2..=4 | 6 => {
                    let mut n = [0u64; 4];
                    for v in &mut n {
                        *v = r.u64().ok_or_else(truncated)?;
                    }
                    let threads = usize::from(r.u16().ok_or_else(truncated)?);
                    let bits: [u8; 3] = r
                        .take(3)
                        .and_then(|b| b.try_into().ok())
                        .ok_or_else(truncated)?;
                    let mut parts = [None; 4];
                    if code >= 3 {
                        for part in &mut parts {
                            let v = r.u64().ok_or_else(truncated)?;
                            *part = (v != NO_PART).then_some(v);
                        }
                    }
                    let layout = HashLayout {
                        options: HashStoreOptions::default()
                            .memory_bytes(n[0])
                            .expected_keys(n[1])
                            .hot_log_disk_bytes(n[2])
                            .cold_log_disk_bytes(n[3])
                            .compaction_threads(threads)
                            .with_parts(parts)
                            .cold_layout(match code {
                                6 => ColdLayout::Runs,
                                _ => ColdLayout::Log,
                            }),
                        page_bits: bits,
                        record_format: if code >= 4 { RECORD_FORMAT } else { 1 },
                    };
                    layout
                        .check()
                        .map_err(|e| format!("hash keyspace {id}'s layout: {e}"))?;
                    KeyspaceKind::Hash(layout)
                }
                other => return Err(format!("keyspace {id} has unknown kind {other}")),
            };
            if id == 0 || id >= next_id {
                return Err(format!("keyspace id {id} is out of range 1..{next_id}"));
            }
            if name.is_empty() || name.len() > MAX_NAME_BYTES {
                return Err(format!("keyspace {id}'s name has {} bytes", name.len()));
            }
            if keyspaces.values().any(|e: &KeyspaceEntry| e.id == id) {
                return Err(format!("keyspace id {id} appears twice"));
            }
            if keyspaces
                .insert(name.to_string(), KeyspaceEntry { id, kind })
                .is_some()
            {
                return Err(format!("keyspace name {name:?} appears twice"));
            }
            // Every build writes the keyspaces in name order (the map's): a manifest
            // decodes only as it encodes.
            if keyspaces
                .range::<str, _>((Bound::Excluded(name), Bound::Unbounded))
                .next()
                .is_some()
            {
                return Err(format!("keyspace {name:?} is out of name order"));
            }
        }
        let count = usize::from(r.u8().ok_or_else(truncated)?);
        if count > KEPT_CHECKPOINTS {
            return Err(format!(
                "{count} checkpoints named; at most {KEPT_CHECKPOINTS} are kept"
            ));
        }
        let mut checkpoints = Vec::with_capacity(count);
        for _ in 0..count {
            let generation = r.u64().ok_or_else(truncated)?;
            if generation > MAX_GENERATION {
                return Err(format!(
                    "checkpoint generation {generation} is out of range"
                ));
            }
            let position = LogPosition {
                block: r.u64().ok_or_else(truncated)?,
                seq: r.u64().ok_or_else(truncated)?,
            };
            let log_end_seq = if version >= 2 {
                r.u64().ok_or_else(truncated)?
            } else {
                position.seq
            };
            if log_end_seq < position.seq {
                return Err(format!(
                    "checkpoint {generation}'s durable log end {log_end_seq} is below its \
                     position {}",
                    position.seq
                ));
            }
            checkpoints.push(CheckpointRef {
                generation,
                position,
                log_end_seq,
            });
        }
        if checkpoints.windows(2).any(|w| {
            matches!(w, [newer, older] if newer.generation <= older.generation
                || newer.position.block < older.position.block
                || newer.position.seq < older.position.seq)
        }) {
            return Err("the checkpoints named are not newest first".into());
        }
        if !r.bytes.is_empty() {
            return Err(format!("{} bytes after the last checkpoint", r.bytes.len()));
        }
        Ok(Manifest {
            next_id,
            keyspaces,
            checkpoints,
            max_key_bytes,
            max_value_bytes,
        })
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let mut m = Manifest::default();
        for (i, name) in ["accounts", "orders", "ünïcode"].iter().enumerate() {
            m.keyspaces.insert(
                name.to_string(),
                KeyspaceEntry {
                    id: i as u32 + 2,
                    kind: KeyspaceKind::Tree {
                        leaf_pages: [1, 4, 8][i % 3],
                    },
                },
            );
        }
        m.keyspaces.insert(
            "counts".to_string(),
            KeyspaceEntry {
                id: 6,
                kind: KeyspaceKind::Hash(
                    HashLayout::new(HashStoreOptions::default().memory_bytes(3 << 20), 4096)
                        .unwrap(),
                ),
            },
        );
        m.keyspaces.insert(
            "sessions".to_string(),
            KeyspaceEntry {
                id: 5,
                kind: KeyspaceKind::Hash(
                    HashLayout::new(
                        HashStoreOptions::default()
                            .memory_bytes(8 << 20)
                            .read_cache_bytes(0)
                            .cold_layout(ColdLayout::Log)
                            .cold_log_memory_bytes(1 << 20),
                        4096,
                    )
                    .unwrap(),
                ),
            },
        );
        m.keyspaces.insert(
            "runs".to_string(),
            KeyspaceEntry {
                id: 7,
                kind: KeyspaceKind::Hash(
                    HashLayout::new(
                        HashStoreOptions::default()
                            .memory_bytes(4 << 20)
                            .cold_layout(ColdLayout::Runs),
                        4096,
                    )
                    .unwrap(),
                ),
            },
        );
        m.next_id = 8;
        m.max_key_bytes = 512;
        m.max_value_bytes = 2048;
        m.checkpoints = vec![
            CheckpointRef {
                generation: 12,
                position: LogPosition {
                    block: 40,
                    seq: 900,
                },
                log_end_seq: 1200,
            },
            CheckpointRef {
                generation: 11,
                position: LogPosition { block: 8, seq: 100 },
                log_end_seq: 950,
            },
        ];
        m
    }

    #[test]
    fn round_trips() {
        let m = sample();
        assert_eq!(Manifest::decode(Path::new("M"), &m.encode()).unwrap(), m);
        let empty = Manifest::default();
        assert_eq!(
            Manifest::decode(Path::new("M"), &empty.encode()).unwrap(),
            empty
        );
    }

    #[test]
    fn a_hash_layout_written_before_its_parts_existed_reads_with_every_part_a_share() {
        // Stores of those builds had the cold log layout.
        let options = HashStoreOptions::default()
            .memory_bytes(3 << 20)
            .cold_layout(ColdLayout::Log);
        let layout = HashLayout::new(options, 4096).unwrap();
        let mut m = Manifest::default();
        m.keyspaces.insert(
            "h".to_string(),
            KeyspaceEntry {
                id: 1,
                kind: KeyspaceKind::Hash(layout.clone()),
            },
        );
        m.next_id = 2;
        let new = m.encode();
        // The same entry as kind 2: no parts after the page sizes.
        let mut body = new[HEADER_BYTES..].to_vec();
        let kind_at = 16 + 4;
        assert_eq!(body[kind_at], 4);
        body[kind_at] = 2;
        let parts_at = kind_at + 1 + 2 + 1 + 4 * 8 + 2 + 3;
        assert!(body[parts_at..parts_at + 32].iter().all(|&b| b == 0xff));
        body.drain(parts_at..parts_at + 32);
        let mut old = new[..8].to_vec();
        old.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
        old.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        old.extend_from_slice(&(body.len() as u32).to_le_bytes());
        old.extend_from_slice(&body);
        // Kind 2 is of the earlier record format (no checksums), and stays so when
        // written back.
        let read = Manifest::decode(Path::new("M"), &old).unwrap();
        let KeyspaceKind::Hash(mut old_layout) = read.keyspaces["h"].kind.clone() else {
            panic!("a hash keyspace");
        };
        assert_eq!(old_layout.record_format, 1);
        let again = Manifest::decode(Path::new("M"), &read.encode()).unwrap();
        assert_eq!(again, read);
        assert_eq!(again.encode()[HEADER_BYTES + kind_at], 3);
        old_layout.record_format = layout.record_format;
        assert_eq!(old_layout, layout);
    }

    /// The bytes of a manifest whose body is `body`.
    fn with_body(body: &[u8]) -> Vec<u8> {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
        bytes.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
        bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
        bytes.extend_from_slice(body);
        bytes
    }

    /// Kind 5 gives a tree's pages per leaf; a tree of one-page leaves is written as
    /// kind 1. Kind 5 of one page used to decode (as kind 1), so a manifest that
    /// decoded did not encode back to its bytes, which the `db_files` fuzz target
    /// demands.
    #[test]
    fn a_tree_of_one_page_leaves_is_kind_1_only() {
        let mut m = Manifest::default();
        m.keyspaces.insert(
            "t".to_string(),
            KeyspaceEntry {
                id: 1,
                kind: KeyspaceKind::Tree { leaf_pages: 4 },
            },
        );
        m.next_id = 2;
        let bytes = m.encode();
        assert_eq!(Manifest::decode(Path::new("M"), &bytes).unwrap(), m);
        let mut body = bytes[HEADER_BYTES..].to_vec();
        let kind_at = 16 + 4;
        let pages_at = kind_at + 1 + 2 + 1;
        assert_eq!((body[kind_at], body[pages_at]), (5, 4));
        for pages in [0, 1, 3, 16, 255] {
            body[pages_at] = pages;
            let err = Manifest::decode(Path::new("M"), &with_body(&body)).unwrap_err();
            assert!(matches!(err, Error::CorruptFile { .. }), "{pages}: {err:?}");
        }
        for pages in [2, 4, 8] {
            body[pages_at] = pages;
            let bytes = with_body(&body);
            let m = Manifest::decode(Path::new("M"), &bytes).unwrap();
            assert_eq!(m.encode(), bytes, "{pages} pages per leaf");
        }
    }

    /// Keyspaces are written in name order; a manifest that lists them in another
    /// decoded to the same catalog, so it did not encode back to its bytes (found by the
    /// `db_files` fuzz target once it wrapped its inputs in the current version).
    #[test]
    fn keyspaces_out_of_name_order_are_refused() {
        let mut m = Manifest::default();
        for (id, name) in [(1, "long"), (2, "lhroe")] {
            m.keyspaces.insert(
                name.to_string(),
                KeyspaceEntry {
                    id,
                    kind: KeyspaceKind::Tree { leaf_pages: 8 },
                },
            );
        }
        m.next_id = 3;
        let bytes = m.encode();
        assert_eq!(Manifest::decode(Path::new("M"), &bytes).unwrap(), m);
        // The two entries (id, kind, name length, name, pages: 13 and 12 bytes),
        // swapped.
        let body = &bytes[HEADER_BYTES..];
        let (first, second) = (16..16 + 13, 16 + 13..16 + 13 + 12);
        assert_eq!(&body[first.start + 7..first.end - 1], b"lhroe");
        assert_eq!(&body[second.start + 7..second.end - 1], b"long");
        let mut swapped = body[..16].to_vec();
        swapped.extend_from_slice(&body[second.clone()]);
        swapped.extend_from_slice(&body[first]);
        swapped.extend_from_slice(&body[second.end..]);
        let err = Manifest::decode(Path::new("M"), &with_body(&swapped)).unwrap_err();
        assert!(
            matches!(&err, Error::CorruptFile { reason, .. } if reason.contains("name order")),
            "{err:?}"
        );
    }

    #[test]
    fn every_truncation_and_every_bit_flip_is_an_error() {
        let bytes = sample().encode();
        for len in 0..bytes.len() {
            let err = Manifest::decode(Path::new("M"), &bytes[..len]).unwrap_err();
            assert!(matches!(err, Error::CorruptFile { .. }), "{len}: {err:?}");
        }
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            // A flip in the version field reads as another version: also refused.
            assert!(Manifest::decode(Path::new("M"), &b).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn another_version_is_incompatible() {
        let mut bytes = sample().encode();
        bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
        let err = Manifest::decode(Path::new("dir/MANIFEST"), &bytes).unwrap_err();
        assert!(
            matches!(&err, Error::Incompatible { reason } if reason.contains("dir/MANIFEST") && reason.contains("version 3")),
            "{err:?}"
        );
    }

    #[test]
    fn a_version_1_manifest_reads_with_each_checkpoints_end_at_its_position() {
        let mut m = sample();
        for c in &mut m.checkpoints {
            c.log_end_seq = c.position.seq;
        }
        let new = m.encode();
        // Version 1: the same body without the durable ends.
        let mut body = new[HEADER_BYTES..].to_vec();
        let count_at = body.len() - 2 * 32 - 1;
        assert_eq!(body[count_at], 2);
        for i in (0..2).rev() {
            let end_at = count_at + 1 + i * 32 + 24;
            body.drain(end_at..end_at + 8);
        }
        let mut old = new[..8].to_vec();
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        old.extend_from_slice(&(body.len() as u32).to_le_bytes());
        old.extend_from_slice(&body);
        assert_eq!(Manifest::decode(Path::new("M"), &old).unwrap(), m);
    }
}
