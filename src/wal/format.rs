//! The write-ahead log's byte formats: segment headers, blocks and records.
//!
//! ```text
//! segment file: [header block][data block][data block]...   (4 KiB blocks)
//!
//! header block          data block
//!  0..4   crc32c         0..4   crc32c of bytes 4..4096
//!  4..12  "bfdbWAL\0"    4..12  segment id (the block's tag)
//! 12..16  format (1)    12..20  block address (global, ascending through segments)
//! 16..24  segment id    20..28  durable horizon: every block below this address was
//! 24..32  first block           durable when this block's group was written
//!         address       28..30  payload bytes used (0..=4064)
//! 32..40  data blocks   30..32  bytes at the payload's start that continue a record
//!                               begun in the block before (0 at a group's first block)
//!                       32..    payload: the record stream
//!
//! record (in the payload stream, may span blocks of one group)
//!  0..4  body length   4..8  crc32c of the body   8..  body
//! body: seq u64 | kind u8 (1 = batch) | op count u32 | ops
//! op:   keyspace u32 | op u8 (1 put, 2 delete) | key len u32 | key | [value len u32 | value]
//! ```
//!
//! All integers are little-endian. A block's tag and address let recovery tell a block
//! written for this segment from a stale one left in a recycled file or torn by a
//! crash; a crash may tear any block not yet covered by a sync (atomic writes are not
//! assumed), and the checksum catches it.
//!
//! Decoders read bytes from disk: every index is checked (`clippy::indexing_slicing` is
//! denied here), and every error is a value, never a panic.
#![deny(clippy::indexing_slicing)]

use crate::storage::LOG_BLOCK_BYTES;

/// The log format this code writes and reads.
pub(crate) const FORMAT_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"bfdbWAL\0";

/// Bytes of a data block's header.
pub(crate) const BLOCK_HEADER_BYTES: usize = 32;
/// Payload bytes of one data block.
pub(crate) const BLOCK_PAYLOAD_BYTES: usize = LOG_BLOCK_BYTES - BLOCK_HEADER_BYTES;
/// Bytes of a record's frame (length and checksum) before its body.
pub(crate) const RECORD_FRAME_BYTES: usize = 8;

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
const KIND_BATCH: u8 = 1;

/// Little-endian reads that answer `None` past the end of the bytes: how every decoder
/// of bytes from disk (log blocks and records, the manifest, checkpoint files) reads.
pub(crate) struct Cursor<'a> {
    /// What is left to read.
    pub(crate) bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.bytes.split_at_checked(n)?;
        self.bytes = rest;
        Some(head)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }

    pub(crate) fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// The crc32c over a block's bytes after its checksum field.
fn block_crc(block: &[u8]) -> Option<u32> {
    Some(crc32c::crc32c(block.get(4..)?))
}

/// Stores the block's checksum in its first four bytes.
fn seal(block: &mut [u8; LOG_BLOCK_BYTES]) {
    let crc = crc32c::crc32c(&block[4..]);
    block[..4].copy_from_slice(&crc.to_le_bytes());
}

/// Whether `block`'s checksum matches its bytes.
fn sealed(block: &[u8]) -> bool {
    let mut c = Cursor { bytes: block };
    block.len() == LOG_BLOCK_BYTES && c.u32().is_some_and(|crc| Some(crc) == block_crc(block))
}

/// A segment's header block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    pub(crate) id: u64,
    /// The address of the segment's first data block.
    pub(crate) first_block: u64,
    pub(crate) data_blocks: u64,
}

/// Why a segment header did not decode.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderError {
    /// Torn, never written or not a log segment: the checksum or magic is wrong.
    Invalid,
    /// A valid header of another format version.
    Version(u32),
}

impl SegmentHeader {
    /// The header's block.
    pub(crate) fn encode(&self) -> [u8; LOG_BLOCK_BYTES] {
        let mut b = [0u8; LOG_BLOCK_BYTES];
        b[4..12].copy_from_slice(MAGIC);
        b[12..16].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..32].copy_from_slice(&self.first_block.to_le_bytes());
        b[32..40].copy_from_slice(&self.data_blocks.to_le_bytes());
        seal(&mut b);
        b
    }

    /// Decodes a header block.
    pub(crate) fn decode(block: &[u8]) -> Result<SegmentHeader, HeaderError> {
        let mut c = Cursor { bytes: block };
        c.u32().ok_or(HeaderError::Invalid)?;
        if c.take(8) != Some(MAGIC.as_slice()) || !sealed(block) {
            return Err(HeaderError::Invalid);
        }
        let version = c.u32().ok_or(HeaderError::Invalid)?;
        if version != FORMAT_VERSION {
            return Err(HeaderError::Version(version));
        }
        let (id, first_block, data_blocks) = (c.u64(), c.u64(), c.u64());
        Ok(SegmentHeader {
            id: id.ok_or(HeaderError::Invalid)?,
            first_block: first_block.ok_or(HeaderError::Invalid)?,
            data_blocks: data_blocks.ok_or(HeaderError::Invalid)?,
        })
    }
}

/// What a valid data block says of itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockHeader {
    pub(crate) segment: u64,
    pub(crate) address: u64,
    /// Every block below this address was durable when this block was written.
    pub(crate) durable_horizon: u64,
    pub(crate) used: usize,
    pub(crate) continued: usize,
}

/// Builds a data block `header` (its `used` is the payload's length) with `payload`
/// (at most [`BLOCK_PAYLOAD_BYTES`]).
#[expect(
    clippy::indexing_slicing,
    reason = "an encoder: the payload's length is asserted to fit the block's payload area"
)]
pub(crate) fn encode_block(header: &BlockHeader, payload: &[u8]) -> [u8; LOG_BLOCK_BYTES] {
    assert!(payload.len() <= BLOCK_PAYLOAD_BYTES && header.continued <= payload.len());
    let mut b = [0u8; LOG_BLOCK_BYTES];
    b[4..12].copy_from_slice(&header.segment.to_le_bytes());
    b[12..20].copy_from_slice(&header.address.to_le_bytes());
    b[20..28].copy_from_slice(&header.durable_horizon.to_le_bytes());
    b[28..30].copy_from_slice(&(payload.len() as u16).to_le_bytes());
    b[30..32].copy_from_slice(&(header.continued as u16).to_le_bytes());
    b[BLOCK_HEADER_BYTES..BLOCK_HEADER_BYTES + payload.len()].copy_from_slice(payload);
    seal(&mut b);
    b
}

/// The header and payload of a data block, if its checksum holds and its fields are in
/// range; `None` for a torn, stale-format or never-written block.
pub(crate) fn decode_block(block: &[u8]) -> Option<(BlockHeader, &[u8])> {
    if !sealed(block) {
        return None;
    }
    let mut c = Cursor {
        bytes: block.get(4..)?,
    };
    let segment = c.u64()?;
    let address = c.u64()?;
    let durable_horizon = c.u64()?;
    let used = usize::from(c.u16()?);
    let continued = usize::from(c.u16()?);
    if used > BLOCK_PAYLOAD_BYTES || continued > used {
        return None;
    }
    let payload = block.get(BLOCK_HEADER_BYTES..BLOCK_HEADER_BYTES + used)?;
    Some((
        BlockHeader {
            segment,
            address,
            durable_horizon,
            used,
            continued,
        },
        payload,
    ))
}

/// One change in a log record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogOp {
    /// Insert or replace `key` with `value` in `keyspace`.
    Put {
        /// The keyspace's id.
        keyspace: u32,
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
    },
    /// Delete `key` from `keyspace`.
    Delete {
        /// The keyspace's id.
        keyspace: u32,
        /// The key.
        key: Vec<u8>,
    },
}

/// A log record: a batch of changes applied atomically, with its sequence number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// The record's sequence number: ascending in the order records were appended.
    pub seq: u64,
    /// The changes, in order.
    pub ops: Vec<LogOp>,
}

/// One change in a log record, borrowing its key and value: what the write path
/// appends, so that logging a write copies its bytes once, into the log's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogOpRef<'a> {
    /// Insert or replace `key` with `value` in `keyspace`.
    Put {
        /// The keyspace's id.
        keyspace: u32,
        /// The key.
        key: &'a [u8],
        /// The value.
        value: &'a [u8],
    },
    /// Delete `key` from `keyspace`.
    Delete {
        /// The keyspace's id.
        keyspace: u32,
        /// The key.
        key: &'a [u8],
    },
}

impl<'a> LogOpRef<'a> {
    /// The write of `key` in `keyspace`: a put of `value`, or a delete for `None`.
    pub fn write(keyspace: u32, key: &'a [u8], value: Option<&'a [u8]>) -> LogOpRef<'a> {
        match value {
            Some(value) => LogOpRef::Put {
                keyspace,
                key,
                value,
            },
            None => LogOpRef::Delete { keyspace, key },
        }
    }
}

impl LogOp {
    /// The change as a [`LogOpRef`] borrowing this one's bytes.
    pub fn as_ref(&self) -> LogOpRef<'_> {
        match self {
            LogOp::Put {
                keyspace,
                key,
                value,
            } => LogOpRef::Put {
                keyspace: *keyspace,
                key,
                value,
            },
            LogOp::Delete { keyspace, key } => LogOpRef::Delete {
                keyspace: *keyspace,
                key,
            },
        }
    }
}

/// Appends the body of a record of `ops` with sequence number `seq` to `out`.
pub(crate) fn encode_body<'a>(
    seq: u64,
    ops: impl ExactSizeIterator<Item = LogOpRef<'a>>,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(&seq.to_le_bytes());
    out.push(KIND_BATCH);
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        let (keyspace, kind, key, value) = match op {
            LogOpRef::Put {
                keyspace,
                key,
                value,
            } => (keyspace, OP_PUT, key, Some(value)),
            LogOpRef::Delete { keyspace, key } => (keyspace, OP_DELETE, key, None),
        };
        out.extend_from_slice(&keyspace.to_le_bytes());
        out.push(kind);
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key);
        if let Some(value) = value {
            out.extend_from_slice(&(value.len() as u32).to_le_bytes());
            out.extend_from_slice(value);
        }
    }
}

/// Appends a framed record (length, checksum, body) of `ops` to `out`.
pub(crate) fn encode_record<'a>(
    seq: u64,
    ops: impl ExactSizeIterator<Item = LogOpRef<'a>>,
    out: &mut Vec<u8>,
) {
    let at = out.len();
    out.extend_from_slice(&[0u8; RECORD_FRAME_BYTES]);
    encode_body(seq, ops, out);
    let body_len = (out.len() - at - RECORD_FRAME_BYTES) as u32;
    let crc = crc32c::crc32c(out.get(at + RECORD_FRAME_BYTES..).unwrap_or_default());
    if let Some(frame) = out.get_mut(at..at + RECORD_FRAME_BYTES) {
        let (len_field, crc_field) = frame.split_at_mut(4);
        len_field.copy_from_slice(&body_len.to_le_bytes());
        crc_field.copy_from_slice(&crc.to_le_bytes());
    }
}

/// A record frame's body length and checksum.
pub(crate) fn decode_frame(frame: &[u8]) -> Option<(usize, u32)> {
    let mut c = Cursor { bytes: frame };
    Some((c.u32()? as usize, c.u32()?))
}

/// Decodes a record body; `None` if it is malformed.
pub(crate) fn decode_body(body: &[u8]) -> Option<LogRecord> {
    let mut c = Cursor { bytes: body };
    let seq = c.u64()?;
    if c.u8()? != KIND_BATCH {
        return None;
    }
    let count = c.u32()?;
    let mut ops = Vec::with_capacity((count as usize).min(body.len()));
    for _ in 0..count {
        let keyspace = c.u32()?;
        let kind = c.u8()?;
        let key_len = c.u32()? as usize;
        let key = c.take(key_len)?.to_vec();
        ops.push(match kind {
            OP_PUT => {
                let value_len = c.u32()? as usize;
                let value = c.take(value_len)?.to_vec();
                LogOp::Put {
                    keyspace,
                    key,
                    value,
                }
            }
            OP_DELETE => LogOp::Delete { keyspace, key },
            _ => return None,
        });
    }
    c.bytes.is_empty().then_some(LogRecord { seq, ops })
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, reason = "tests index their own buffers")]
mod tests {
    use super::*;

    fn ops() -> Vec<LogOp> {
        vec![
            LogOp::Put {
                keyspace: 3,
                key: b"k".to_vec(),
                value: b"value".to_vec(),
            },
            LogOp::Delete {
                keyspace: 4,
                key: b"gone".to_vec(),
            },
        ]
    }

    #[test]
    fn records_round_trip_and_reject_every_truncation() {
        let mut framed = Vec::new();
        encode_record(42, ops().iter().map(LogOp::as_ref), &mut framed);
        let (len, crc) = decode_frame(&framed).unwrap();
        let body = &framed[RECORD_FRAME_BYTES..];
        assert_eq!((len, crc), (body.len(), crc32c::crc32c(body)));
        assert_eq!(
            decode_body(body),
            Some(LogRecord {
                seq: 42,
                ops: ops()
            })
        );
        for cut in 0..body.len() {
            assert_eq!(decode_body(&body[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn blocks_round_trip_and_any_flipped_bit_is_caught() {
        let header = BlockHeader {
            segment: 7,
            address: 99,
            durable_horizon: 90,
            used: 7,
            continued: 3,
        };
        let block = encode_block(&header, b"payload");
        let (h, payload) = decode_block(&block).unwrap();
        assert_eq!(h, header);
        assert_eq!(payload, b"payload");
        for bit in (0..LOG_BLOCK_BYTES * 8).step_by(97) {
            let mut bad = block;
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_block(&bad).is_none(), "bit {bit}");
        }
        assert!(decode_block(&[0u8; LOG_BLOCK_BYTES]).is_none());
    }

    #[test]
    fn segment_headers_round_trip_and_name_another_version() {
        let h = SegmentHeader {
            id: 5,
            first_block: 1000,
            data_blocks: 63,
        };
        assert_eq!(SegmentHeader::decode(&h.encode()), Ok(h));
        let mut other = h.encode();
        other[12..16].copy_from_slice(&9u32.to_le_bytes());
        seal(&mut other);
        assert_eq!(SegmentHeader::decode(&other), Err(HeaderError::Version(9)));
        assert_eq!(
            SegmentHeader::decode(&[0u8; LOG_BLOCK_BYTES]),
            Err(HeaderError::Invalid)
        );
    }
}
