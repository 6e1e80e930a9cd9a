//! Checkpoint files: for each tree keyspace, its leaf pages in key order — each one's
//! low routing key and the physical page slot holding it — and the log position from
//! which recovery replays.
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
//!   per keyspace: id (u32), leaf count (u64),
//!                 per leaf: page slot (u64), low key length (u16), low key
//!   hash keyspace count (u32)                                  (version 2 on)
//!   per hash keyspace: id (u32); the hot log's begin and tail, its index's home
//!                 buckets; the cold log's begin and tail; the chunk log's begin and
//!                 tail, the chunk table's home buckets (u64 each)
//! trailer:
//!   body length (u64), crc32c of the body (u32)
//! ```
//!
//! The file is written to `ckpt-<generation>.tmp`, synced, renamed, and the directory
//! synced; it counts only once the manifest names it. Decoding accepts any bytes and
//! reports what is wrong; it never panics.

#![deny(clippy::indexing_slicing)]

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::manifest::{named, sync_dir};
use crate::error::{Error, Result};
use crate::hash::f2::F2Extents;
use crate::hash::hlog::LogExtent;
use crate::wal::{Cursor, LogPosition};

const MAGIC: [u8; 8] = *b"BFDBCKPT";
/// The checkpoint format this build writes. It reads this one and version 1 (before
/// hash keyspaces, which has no hash section).
pub(crate) const CHECKPOINT_VERSION: u32 = 2;
const TRAILER_BYTES: usize = 12;

/// One keyspace's leaves in a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyspaceLeaves {
    pub(crate) id: u32,
    /// (low routing key, physical page slot), in key order.
    pub(crate) leaves: Vec<(Vec<u8>, u64)>,
}

/// A decoded checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub(crate) generation: u64,
    pub(crate) position: LogPosition,
    pub(crate) keyspaces: Vec<KeyspaceLeaves>,
    /// Each hash keyspace's logs, by keyspace id.
    pub(crate) hash: Vec<(u32, F2Extents)>,
}

/// The numbers of a hash keyspace's record, in file order.
fn extent_fields(e: &F2Extents) -> [u64; 8] {
    [
        e.hot.begin,
        e.hot.tail,
        e.hot_buckets,
        e.cold.begin,
        e.cold.tail,
        e.chunks.begin,
        e.chunks.tail,
        e.chunk_buckets,
    ]
}

fn extents_from(f: [u64; 8]) -> F2Extents {
    let [
        hot_begin,
        hot_tail,
        hot_buckets,
        cold_begin,
        cold_tail,
        chunks_begin,
        chunks_tail,
        chunk_buckets,
    ] = f;
    F2Extents {
        hot: LogExtent {
            begin: hot_begin,
            tail: hot_tail,
        },
        hot_buckets,
        cold: LogExtent {
            begin: cold_begin,
            tail: cold_tail,
        },
        chunks: LogExtent {
            begin: chunks_begin,
            tail: chunks_tail,
        },
        chunk_buckets,
    }
}

/// The file name of checkpoint `generation`.
pub(crate) fn file_name(generation: u64) -> String {
    format!("ckpt-{generation:016x}")
}

/// The path of checkpoint `generation` in `dir`.
pub(crate) fn path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(file_name(generation))
}

impl Checkpoint {
    /// The file's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.position.block.to_le_bytes());
        b.extend_from_slice(&self.position.seq.to_le_bytes());
        b.extend_from_slice(&(self.keyspaces.len() as u32).to_le_bytes());
        for ks in &self.keyspaces {
            b.extend_from_slice(&ks.id.to_le_bytes());
            b.extend_from_slice(&(ks.leaves.len() as u64).to_le_bytes());
            for (low, slot) in &ks.leaves {
                b.extend_from_slice(&slot.to_le_bytes());
                b.extend_from_slice(&(low.len() as u16).to_le_bytes());
                b.extend_from_slice(low);
            }
        }
        b.extend_from_slice(&(self.hash.len() as u32).to_le_bytes());
        for (id, extents) in &self.hash {
            b.extend_from_slice(&id.to_le_bytes());
            for n in extent_fields(extents) {
                b.extend_from_slice(&n.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&b);
        let len = b.len() as u64;
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(&crc.to_le_bytes());
        b
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
        if version != CHECKPOINT_VERSION && version != 1 {
            return Err(Error::Incompatible {
                reason: format!(
                    "{} is checkpoint format version {version}; this build reads version \
                     {CHECKPOINT_VERSION} and 1",
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
            // No capacity from the count: a damaged one could claim anything.
            let mut leaves = Vec::new();
            for _ in 0..leaves_count {
                let slot = r.u64().ok_or_else(truncated)?;
                let len = usize::from(r.u16().ok_or_else(truncated)?);
                let low = r.take(len).ok_or_else(truncated)?.to_vec();
                leaves.push((low, slot));
            }
            keyspaces.push(KeyspaceLeaves { id, leaves });
        }
        let mut hash = Vec::new();
        if version >= 2 {
            let count = r.u32().ok_or_else(truncated)?;
            for _ in 0..count {
                let id = r.u32().ok_or_else(truncated)?;
                let mut fields = [0u64; 8];
                for f in &mut fields {
                    *f = r.u64().ok_or_else(truncated)?;
                }
                hash.push((id, extents_from(fields)));
            }
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
        })
    }

    /// Reads and decodes checkpoint `generation` of `dir`.
    pub(crate) fn load(dir: &Path, generation: u64) -> Result<Checkpoint> {
        let path = path(dir, generation);
        let bytes = fs::read(&path).map_err(|e| Error::Io(named(&path, e)))?;
        let ckpt = Checkpoint::decode(&path, &bytes)?;
        if ckpt.generation != generation {
            return Err(Error::CorruptFile {
                path,
                reason: format!("it holds checkpoint {}", ckpt.generation),
            });
        }
        Ok(ckpt)
    }

    /// Writes the checkpoint's file in `dir` durably (module docs).
    pub(crate) fn store(&self, dir: &Path) -> Result<()> {
        let path = path(dir, self.generation);
        let tmp = dir.join(format!("{}.tmp", file_name(self.generation)));
        let write = || -> io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            f.write_all(&self.encode())?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            sync_dir(dir)
        };
        write().map_err(|e| Error::Io(named(&path, e)))
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
                    leaves: vec![(vec![], 5), (b"m".to_vec(), 9), (b"t".repeat(300), 2)],
                },
                KeyspaceLeaves {
                    id: 4,
                    leaves: vec![(vec![], 3)],
                },
            ],
            hash: vec![(5, extents_from([64, 9000, 1024, 64, 4096, 128, 70000, 256]))],
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
