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
//! record, format 2 (in the payload stream, may span blocks of one group)
//!  body length varint | crc32c u32 of the body | body
//! body: seq varint | kind u8 (1 = batch) | op count varint | ops
//! op:   op u8 (1 put, 2 delete) | keyspace varint | key len varint | key
//!       | [value len varint | value]
//!
//! record, format 1 (read, no longer written)
//!  0..4  body length   4..8  crc32c of the body   8..  body
//! body: seq u64 | kind u8 (1 = batch) | op count u32 | ops
//! op:   keyspace u32 | op u8 (1 put, 2 delete) | key len u32 | key | [value len u32 | value]
//! ```
//!
//! Fixed-width integers are little-endian; a varint is unsigned LEB128 (seven bits a
//! byte, low bits first, the high bit set on every byte but the last). A segment's header names the format of every record in it (a group, and so a record,
//! never spans two segments), so a log written by format 1 is read on and continued in
//! format 2. A block's tag and address let recovery tell a block
//! written for this segment from a stale one left in a recycled file or torn by a
//! crash; a crash may tear any block not yet covered by a sync (atomic writes are not
//! assumed), and the checksum catches it.
//!
//! Decoders read bytes from disk: every index is checked (`clippy::indexing_slicing` is
//! denied here), and every error is a value, never a panic.
#![deny(clippy::indexing_slicing)]

use crate::storage::LOG_BLOCK_BYTES;

/// The log format this code writes: format 2 and one more op, a put whose value is kept
/// out of line (the op holds its reference).
pub(crate) const FORMAT_VERSION: u32 = 3;
/// The oldest log format this code still reads.
pub(crate) const OLDEST_READABLE_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"bfdbWAL\0";

/// Bytes of a data block's header.
pub(crate) const BLOCK_HEADER_BYTES: usize = 32;
/// Payload bytes of one data block.
pub(crate) const BLOCK_PAYLOAD_BYTES: usize = LOG_BLOCK_BYTES - BLOCK_HEADER_BYTES;
/// The most bytes a varint of a `u64` takes.
const MAX_VARINT_BYTES: usize = 10;

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
/// A put whose value is in the value store: the op's value is its reference (format 3).
const OP_PUT_EXTERNAL: u8 = 3;
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

    /// An unsigned LEB128 varint; `None` past the end, or for one longer than a `u64`'s.
    pub(crate) fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for i in 0..MAX_VARINT_BYTES {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            // The tenth byte holds a u64's last bit; anything above it overflows.
            if i == MAX_VARINT_BYTES - 1 && bits > 1 {
                return None;
            }
            value |= bits << (7 * i);
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    /// A varint that must fit a `usize` (a length).
    fn length(&mut self) -> Option<usize> {
        usize::try_from(self.varint()?).ok()
    }

    /// A varint that must fit a `u32` (a keyspace id).
    fn varint_u32(&mut self) -> Option<u32> {
        u32::try_from(self.varint()?).ok()
    }
}

/// Appends `value` as a varint to `out`.
#[inline]
fn push_varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
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
    /// The format of the segment's records: [`FORMAT_VERSION`] for a segment this code
    /// writes, or an older one it still reads.
    pub(crate) format: u32,
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
        b[12..16].copy_from_slice(&self.format.to_le_bytes());
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
        let format = c.u32().ok_or(HeaderError::Invalid)?;
        if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&format) {
            return Err(HeaderError::Version(format));
        }
        let (id, first_block, data_blocks) = (c.u64(), c.u64(), c.u64());
        Ok(SegmentHeader {
            format,
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
    /// Insert or replace `key` in `keyspace` with the value kept out of line that
    /// `reference` names (its bytes were written to the value store before the record).
    PutExternal {
        /// The keyspace's id.
        keyspace: u32,
        /// The key.
        key: Vec<u8>,
        /// The value's reference in the value store.
        reference: Vec<u8>,
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
    /// Insert or replace `key` with the out-of-line value `reference` names.
    PutExternal {
        /// The keyspace's id.
        keyspace: u32,
        /// The key.
        key: &'a [u8],
        /// The value's reference in the value store.
        reference: &'a [u8],
    },
}

impl<'a> LogOpRef<'a> {
    /// The op's keyspace, op code, key and (for a put) value: what both formats write.
    fn parts(self) -> (u32, u8, &'a [u8], Option<&'a [u8]>) {
        match self {
            LogOpRef::Put {
                keyspace,
                key,
                value,
            } => (keyspace, OP_PUT, key, Some(value)),
            LogOpRef::Delete { keyspace, key } => (keyspace, OP_DELETE, key, None),
            LogOpRef::PutExternal {
                keyspace,
                key,
                reference,
            } => (keyspace, OP_PUT_EXTERNAL, key, Some(reference)),
        }
    }

    /// The op's keyspace and key.
    pub(crate) fn target(self) -> (u32, &'a [u8]) {
        let (keyspace, _, key, _) = self.parts();
        (keyspace, key)
    }

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
            LogOp::PutExternal {
                keyspace,
                key,
                reference,
            } => LogOpRef::PutExternal {
                keyspace: *keyspace,
                key,
                reference,
            },
        }
    }
}

/// Bytes of `value` as a varint.
#[inline]
fn varint_len(value: u64) -> usize {
    // Bits needed (at least one), seven a byte.
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

/// Bytes of one op in a format-2 body.
#[inline]
fn op_len(op: LogOpRef<'_>) -> usize {
    let (keyspace, _, key, value) = op.parts();
    1 + varint_len(u64::from(keyspace))
        + varint_len(key.len() as u64)
        + key.len()
        + value.map_or(0, |v| varint_len(v.len() as u64) + v.len())
}

/// Appends a framed format-2 record of `ops` with sequence number `seq` to `out`, in one
/// pass over its bytes (the body's length, which the frame starts with, is summed from
/// the ops first).
pub(crate) fn encode_record<'a>(
    seq: u64,
    ops: impl ExactSizeIterator<Item = LogOpRef<'a>> + Clone,
    out: &mut Vec<u8>,
) {
    let body_len =
        varint_len(seq) + 1 + varint_len(ops.len() as u64) + ops.clone().map(op_len).sum::<usize>();
    out.reserve(varint_len(body_len as u64) + 4 + body_len);
    push_varint(body_len as u64, out);
    let crc_at = out.len();
    out.extend_from_slice(&[0u8; 4]);
    let body_at = out.len();
    push_varint(seq, out);
    out.push(KIND_BATCH);
    push_varint(ops.len() as u64, out);
    for op in ops {
        let (keyspace, kind, key, value) = op.parts();
        out.push(kind);
        push_varint(u64::from(keyspace), out);
        push_varint(key.len() as u64, out);
        out.extend_from_slice(key);
        if let Some(value) = value {
            push_varint(value.len() as u64, out);
            out.extend_from_slice(value);
        }
    }
    debug_assert_eq!(out.len() - body_at, body_len);
    let crc = crc32c::crc32c(out.get(body_at..).unwrap_or_default());
    if let Some(field) = out.get_mut(crc_at..crc_at + 4) {
        field.copy_from_slice(&crc.to_le_bytes());
    }
}

/// A record's frame as read from the start of the record stream's bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// The body's length and checksum, and the frame's own length.
    Complete {
        frame_bytes: usize,
        body_bytes: usize,
        crc: u32,
    },
    /// The bytes end inside the frame.
    Incomplete,
    /// Not a frame: a length that is no varint.
    Malformed,
}

/// Reads a record's frame (length and checksum) in log format `format`.
pub(crate) fn decode_frame(format: u32, bytes: &[u8]) -> Frame {
    let mut c = Cursor { bytes };
    let body_bytes = if format == 1 {
        c.u32().map(|len| len as usize)
    } else {
        match c.length() {
            Some(len) => Some(len),
            // A varint cut off by the end of the bytes is incomplete; one that runs
            // on past ten bytes (or does not fit) is no frame.
            None if bytes.len() < MAX_VARINT_BYTES && bytes.iter().all(|b| b & 0x80 != 0) => None,
            None => return Frame::Malformed,
        }
    };
    match (body_bytes, c.u32()) {
        (Some(body_bytes), Some(crc)) => Frame::Complete {
            frame_bytes: bytes.len() - c.bytes.len(),
            body_bytes,
            crc,
        },
        _ => Frame::Incomplete,
    }
}

/// Decodes a record body of log format `format`; `None` if it is malformed.
pub(crate) fn decode_body(format: u32, body: &[u8]) -> Option<LogRecord> {
    if format == 1 {
        return decode_body_v1(body);
    }
    let mut c = Cursor { bytes: body };
    let seq = c.varint()?;
    if c.u8()? != KIND_BATCH {
        return None;
    }
    let count = c.length()?;
    let mut ops = Vec::with_capacity(count.min(body.len()));
    for _ in 0..count {
        let kind = c.u8()?;
        if kind == OP_PUT_EXTERNAL && format < 3 {
            return None;
        }
        let keyspace = c.varint_u32()?;
        ops.push(decode_op(&mut c, kind, keyspace, |c| c.length())?);
    }
    c.bytes.is_empty().then_some(LogRecord { seq, ops })
}

/// Decodes a format-1 record body.
fn decode_body_v1(body: &[u8]) -> Option<LogRecord> {
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
        ops.push(decode_op(&mut c, kind, keyspace, |c| {
            Some(c.u32()? as usize)
        })?);
    }
    c.bytes.is_empty().then_some(LogRecord { seq, ops })
}

/// The rest of an op of `kind` in `keyspace`, past those two fields: the key, and a
/// put's value, each after its length as `length` reads it (the formats differ only
/// there, and in the order of the first two fields).
fn decode_op<'a>(
    c: &mut Cursor<'a>,
    kind: u8,
    keyspace: u32,
    length: impl Fn(&mut Cursor<'a>) -> Option<usize>,
) -> Option<LogOp> {
    let key_len = length(c)?;
    let key = c.take(key_len)?.to_vec();
    Some(match kind {
        OP_PUT => {
            let value_len = length(c)?;
            LogOp::Put {
                keyspace,
                key,
                value: c.take(value_len)?.to_vec(),
            }
        }
        OP_DELETE => LogOp::Delete { keyspace, key },
        OP_PUT_EXTERNAL => {
            let reference_len = length(c)?;
            LogOp::PutExternal {
                keyspace,
                key,
                reference: c.take(reference_len)?.to_vec(),
            }
        }
        _ => return None,
    })
}

/// Appends a framed format-1 record: what the code before format 2 wrote, kept to test
/// that such logs are still read.
#[cfg(test)]
pub(crate) fn encode_record_v1(seq: u64, ops: &[LogOp], out: &mut Vec<u8>) {
    let mut body = Vec::new();
    body.extend_from_slice(&seq.to_le_bytes());
    body.push(KIND_BATCH);
    body.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        let (keyspace, kind, key, value) = op.as_ref().parts();
        body.extend_from_slice(&keyspace.to_le_bytes());
        body.push(kind);
        body.extend_from_slice(&(key.len() as u32).to_le_bytes());
        body.extend_from_slice(key);
        if let Some(value) = value {
            body.extend_from_slice(&(value.len() as u32).to_le_bytes());
            body.extend_from_slice(value);
        }
    }
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
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

    /// The body of a framed record, checking its frame.
    fn body_of(format: u32, framed: &[u8]) -> &[u8] {
        let Frame::Complete {
            frame_bytes,
            body_bytes,
            crc,
        } = decode_frame(format, framed)
        else {
            panic!("no frame");
        };
        let body = &framed[frame_bytes..];
        assert_eq!((body_bytes, crc), (body.len(), crc32c::crc32c(body)));
        body
    }

    #[test]
    fn records_round_trip_and_reject_every_truncation() {
        for seq in [0, 1, 127, 128, 42_000_000, u64::MAX] {
            let mut framed = Vec::new();
            encode_record(seq, ops().iter().map(LogOp::as_ref), &mut framed);
            let body = body_of(FORMAT_VERSION, &framed);
            let record = LogRecord { seq, ops: ops() };
            assert_eq!(decode_body(FORMAT_VERSION, body), Some(record));
            for cut in 0..body.len() {
                assert_eq!(
                    decode_body(FORMAT_VERSION, &body[..cut]),
                    None,
                    "cut at {cut}"
                );
            }
            for cut in 0..framed.len() - body.len() {
                assert_eq!(
                    decode_frame(FORMAT_VERSION, &framed[..cut]),
                    Frame::Incomplete
                );
            }
        }
    }

    #[test]
    fn the_dense_format_frames_a_small_write_in_14_bytes_not_34() {
        let op = LogOp::Put {
            keyspace: 1,
            key: vec![7; 16],
            value: vec![9; 16],
        };
        let (mut dense, mut old) = (Vec::new(), Vec::new());
        encode_record(1_000_000, std::iter::once(op.as_ref()), &mut dense);
        encode_record_v1(1_000_000, std::slice::from_ref(&op), &mut old);
        // 32 bytes of key and value: 34 bytes of framing in format 1, 14 in format 2.
        assert_eq!((old.len(), dense.len()), (66, 46));
    }

    #[test]
    fn format_1_records_are_still_read() {
        let mut framed = Vec::new();
        encode_record_v1(42, &ops(), &mut framed);
        let body = body_of(1, &framed);
        assert_eq!(
            decode_body(1, body),
            Some(LogRecord {
                seq: 42,
                ops: ops()
            })
        );
        // The same bytes are no format-2 record.
        assert_eq!(decode_body(FORMAT_VERSION, body), None);
    }

    #[test]
    fn varints_round_trip_and_overlong_ones_are_refused() {
        for value in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = Vec::new();
            push_varint(value, &mut out);
            let mut c = Cursor { bytes: &out };
            assert_eq!((c.varint(), c.bytes.len()), (Some(value), 0));
        }
        // Eleven continuation bytes, and a tenth byte carrying more than a u64's last bit.
        assert_eq!(Cursor { bytes: &[0x80; 11] }.varint(), None);
        let mut too_big = [0xff; 10];
        too_big[9] = 0x02;
        assert_eq!(Cursor { bytes: &too_big }.varint(), None);
        assert_eq!(decode_frame(FORMAT_VERSION, &[0x80; 11]), Frame::Malformed);
        assert_eq!(decode_frame(FORMAT_VERSION, &[0x80; 3]), Frame::Incomplete);
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
            format: FORMAT_VERSION,
            id: 5,
            first_block: 1000,
            data_blocks: 63,
        };
        assert_eq!(SegmentHeader::decode(&h.encode()), Ok(h));
        let mut other = h.encode();
        other[12..16].copy_from_slice(&9u32.to_le_bytes());
        seal(&mut other);
        assert_eq!(SegmentHeader::decode(&other), Err(HeaderError::Version(9)));
        let old = SegmentHeader { format: 1, ..h };
        assert_eq!(SegmentHeader::decode(&old.encode()), Ok(old));
        let zero = SegmentHeader { format: 0, ..h };
        assert_eq!(
            SegmentHeader::decode(&zero.encode()),
            Err(HeaderError::Version(0))
        );
        assert_eq!(
            SegmentHeader::decode(&[0u8; LOG_BLOCK_BYTES]),
            Err(HeaderError::Invalid)
        );
    }
}
