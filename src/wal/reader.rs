//! Reading the log back on open: the segments in id order, each block checked, the
//! record stream reassembled, stopping cleanly at a torn or stale tail and refusing a
//! log damaged in its middle.
//!
//! **The chain rule.** A segment continues the log only if its first block address is
//! the address just past the last valid block read so far. A writer that fills a segment
//! starts the next one there; recovery, which ends the log at its last valid block,
//! starts a fresh segment there too. So blocks after a torn one — left by groups whose
//! writes were in flight at the crash, never acknowledged — are never replayed, whatever
//! tag they carry, and a segment written after them is not chained on.
//!
//! **Torn tail or damage.** A block that does not validate where the chain expects one
//! ends the log (a *hole* at that address) — unless some later valid block of this log
//! says, in its durable horizon, that every block below an address past the hole was
//! durable when it was written. Then the hole held durable, possibly acknowledged,
//! records, and reading on would lose them silently: that is an `InvalidData` error
//! naming the segment and block. A crash alone cannot make that happen: groups become
//! durable in order, so no group written after the hole's can carry a horizon past it.
//!
//! **Stale blocks.** A segment made from a spare (a recycled segment) still holds blocks
//! of its file's earlier lives past what was written since: their checksums hold, but
//! they carry an older segment's id (see the writer's module docs for why no such block
//! can carry the id of the segment it is now in). Such a block ends the log like a
//! block never written: it is not damage, and nothing is counted as discarded for it.

use std::io;

use super::format::{self, BLOCK_PAYLOAD_BYTES, Frame, HeaderError, LogRecord, SegmentHeader};
use crate::storage::{LOG_BLOCK_BYTES, LogDevice};

/// What reading the log found.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The complete records, in log order.
    pub records: Vec<LogRecord>,
    /// The address of the block after the last valid one: where the next segment starts.
    pub(crate) next_block: u64,
    /// Bytes discarded at the tail: an incomplete record's, and a torn block's.
    pub discarded_bytes: u64,
    /// Records discarded at the tail: an incomplete or corrupt last record.
    pub discarded_records: u64,
    /// Segments whose header never reached the disk and that hold no valid block:
    /// created when the process stopped, never written, safe to remove.
    pub(crate) abandoned: Vec<u64>,
}

/// The reassembly of the record stream from block payloads.
#[derive(Default)]
struct Stream {
    /// Bytes of a record not yet complete.
    partial: Vec<u8>,
}

/// An error for damage in the middle of the log.
fn damaged(what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the write-ahead log is damaged: {what}; durable records follow the damage"),
    )
}

/// One data block as read.
enum Block {
    /// Never written in this segment's life: all zeros, or a stale block of the file's
    /// earlier life (a valid block tagged with an older segment's id).
    Empty,
    /// Written, but torn, damaged, or tagged for a later segment.
    Invalid,
    Valid(format::BlockHeader, Vec<u8>),
}

impl Block {
    fn valid(&self) -> Option<&format::BlockHeader> {
        match self {
            Block::Valid(h, _) => Some(h),
            _ => None,
        }
    }
}

/// The data blocks of segment `id`.
fn blocks_of(device: &dyn LogDevice, id: u64, data_blocks: u64) -> io::Result<Vec<Block>> {
    // No capacity from `data_blocks`: a crafted header could claim any count.
    let mut out = Vec::new();
    let mut block = vec![0u8; LOG_BLOCK_BYTES];
    for i in 0..data_blocks {
        let n = device.read_at(id, (i + 1) * LOG_BLOCK_BYTES as u64, &mut block)?;
        if n == 0 {
            break;
        }
        let bytes = block.get(..n).unwrap_or_default();
        out.push(match format::decode_block(bytes) {
            Some((h, payload)) if h.segment == id => Block::Valid(h, payload.to_vec()),
            Some((h, _)) if h.segment < id => Block::Empty,
            _ if bytes.iter().all(|&b| b == 0) => Block::Empty,
            _ => Block::Invalid,
        });
    }
    Ok(out)
}

/// The number of data blocks a segment file of `id` holds, from its length.
fn file_blocks(device: &dyn LogDevice, id: u64) -> io::Result<u64> {
    // Probe the length by halving: the device has no length call, and segments are a
    // few thousand blocks.
    let mut probe = [0u8; 1];
    let (mut lo, mut hi) = (0u64, 1u64 << 24);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if device.read_at(id, mid * LOG_BLOCK_BYTES as u64, &mut probe)? == 1 {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok(lo)
}

/// Reads every segment of `device` and returns the log's complete records. The log
/// starts at block address `start_block` (0 for a log never truncated; else the address
/// a checkpoint recorded, which may lie inside a segment): a segment chain that does
/// not reach it has lost its beginning, and segments wholly below it are history. A
/// record that begins below `start_block` and continues past it is skipped (it is
/// older than the start).
pub(crate) fn read_log(device: &dyn LogDevice, start_block: u64) -> io::Result<Recovered> {
    let mut out = Recovered {
        next_block: start_block,
        ..Recovered::default()
    };
    let mut stream = Stream::default();
    // Where the chain expects the next block, and the hole there if the last read
    // segment ended in one (with the segment it was found in).
    let mut expected = start_block;
    let mut hole: Option<(u64, u64)> = None;
    let mut header_block = vec![0u8; LOG_BLOCK_BYTES];
    let ids = device.list()?;
    let start_segment = start_segment(device, &ids, start_block)?;
    for id in ids {
        let read = device.read_at(id, 0, &mut header_block)?;
        let header = match SegmentHeader::decode(header_block.get(..read).unwrap_or_default()) {
            Ok(h) if h.id == id => h,
            Err(HeaderError::Version(v)) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "log segment {id} is of log format {v}; this bfdb reads formats {} to {}",
                        format::OLDEST_READABLE_VERSION,
                        format::FORMAT_VERSION
                    ),
                ));
            }
            _ => {
                // A header that never reached the disk: the segment was being created
                // when the process stopped, and nothing was written to it. If blocks of
                // it validate, the header was damaged instead.
                let blocks = blocks_of(device, id, file_blocks(device, id)?)?;
                if blocks.iter().any(|b| b.valid().is_some()) {
                    return Err(damaged(format!("log segment {id} has a damaged header")));
                }
                out.abandoned.push(id);
                continue;
            }
        };
        if header.first_block.checked_add(header.data_blocks).is_none() {
            return Err(damaged(format!(
                "log segment {id}'s header gives impossible addresses"
            )));
        }
        let blocks = blocks_of(device, id, header.data_blocks)?;
        // The segment the log starts in, if it starts mid-segment (a checkpoint's log
        // position): its blocks below the start are truncated history.
        let skip = if Some(id) == start_segment
            && out.next_block == start_block
            && hole.is_none()
            && header.first_block < expected
            && expected < header.first_block + header.data_blocks
        {
            (expected - header.first_block) as usize
        } else {
            0
        };
        if header.first_block + skip as u64 != expected {
            // Not chained on: only blocks of unacknowledged groups may lie past a hole
            // (the one the last segment ended in, or the chain's missing beginning).
            let (at, in_segment) = hole.unwrap_or((expected, id));
            check_horizon(&blocks, at, in_segment)?;
            continue;
        }
        hole = None;
        let mut next = expected;
        for (i, block) in blocks.iter().enumerate().skip(skip) {
            let address = header.first_block + i as u64;
            match block {
                Block::Valid(h, payload) if h.address == address => {
                    stream
                        .push(header.format, h.continued, payload, &mut out)
                        .map_err(|what| {
                            damaged(format!("block {address} of log segment {id}: {what}"))
                        })?;
                    next = address + 1;
                }
                _ => {
                    let rest = blocks.get(i + 1..).unwrap_or_default();
                    check_horizon(rest, address, id)?;
                    if !matches!(block, Block::Empty) {
                        out.discarded_bytes += BLOCK_PAYLOAD_BYTES as u64;
                    }
                    hole = Some((address, id));
                    break;
                }
            }
        }
        expected = next;
        out.next_block = next;
    }
    if !stream.partial.is_empty() {
        out.discarded_bytes += stream.partial.len() as u64;
        out.discarded_records += 1;
    }
    Ok(out)
}

/// The segment the log starts in when `start_block` may lie inside one (a checkpoint's
/// position): the last, in id order, whose header is valid and whose range holds it.
///
/// A segment's header gives its capacity, not what was written: after a crash,
/// recovery starts a new segment at the end of the valid blocks, inside the range the
/// last segment's header still claims. So two segments can claim the start, and the
/// later one is the log there (the earlier one's blocks from its first block on were
/// abandoned). Choosing the earlier one read a hole at the start and then refused the
/// log as damaged, since the later segment's blocks vouch for the start (found by
/// `tests/db_kill.rs`).
fn start_segment(device: &dyn LogDevice, ids: &[u64], start_block: u64) -> io::Result<Option<u64>> {
    let mut header_block = vec![0u8; LOG_BLOCK_BYTES];
    let mut found = None;
    for &id in ids {
        let read = device.read_at(id, 0, &mut header_block)?;
        if let Ok(h) = SegmentHeader::decode(header_block.get(..read).unwrap_or_default())
            && h.id == id
            && h.first_block <= start_block
            && h.first_block
                .checked_add(h.data_blocks)
                .is_some_and(|end| start_block < end)
        {
            found = Some(id);
        }
    }
    Ok(found)
}

/// `Err` if a valid block among `blocks` was written when the hole at address `at` (in
/// segment `in_segment`) was already durable.
fn check_horizon(blocks: &[Block], at: u64, in_segment: u64) -> io::Result<()> {
    match blocks
        .iter()
        .filter_map(Block::valid)
        .find(|h| h.durable_horizon > at)
    {
        Some(h) => Err(damaged(format!(
            "block {at} of log segment {in_segment} does not validate, and block {} (segment {}) \
             was written after it was durable",
            h.address, h.segment
        ))),
        None => Ok(()),
    }
}

impl Stream {
    /// Takes one valid block's payload, whose first `continued` bytes continue the
    /// record in progress. `Err` names a record that does not decode although its
    /// block's checksum holds.
    fn push(
        &mut self,
        format: u32,
        continued: usize,
        payload: &[u8],
        out: &mut Recovered,
    ) -> Result<(), String> {
        if continued == 0 && !self.partial.is_empty() {
            // The record in progress never got its continuation: a crash cut it off
            // and a later writer (after recovery) started afresh.
            out.discarded_bytes += self.partial.len() as u64;
            out.discarded_records += 1;
            self.partial.clear();
        }
        if continued > 0 && self.partial.is_empty() {
            // A continuation of a record whose start was not read: skip it.
            return self.take_records(format, payload.get(continued..).unwrap_or_default(), out);
        }
        self.take_records(format, payload, out)
    }

    /// Appends `bytes` (records of log format `format`) to the stream and takes every
    /// record it completes.
    fn take_records(
        &mut self,
        format: u32,
        bytes: &[u8],
        out: &mut Recovered,
    ) -> Result<(), String> {
        self.partial.extend_from_slice(bytes);
        let mut at = 0;
        loop {
            let rest = self.partial.get(at..).unwrap_or_default();
            let (frame_bytes, len, crc) = match format::decode_frame(format, rest) {
                Frame::Complete {
                    frame_bytes,
                    body_bytes,
                    crc,
                } => (frame_bytes, body_bytes, crc),
                Frame::Incomplete => break,
                Frame::Malformed => return Err("a record's length does not decode".into()),
            };
            let Some(body) = rest.get(frame_bytes..).and_then(|b| b.get(..len)) else {
                break;
            };
            match (crc32c::crc32c(body) == crc)
                .then(|| format::decode_body(format, body))
                .flatten()
            {
                Some(record) => out.records.push(record),
                // Valid blocks hold a record that does not check: never skip over it,
                // which would lose it silently.
                None => return Err(format!("a record of {len} bytes does not decode")),
            }
            at += frame_bytes + len;
        }
        self.partial.drain(..at);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::format::{BlockHeader, LogOp, LogRecord, SegmentHeader, encode_block};
    use crate::storage::{LOG_BLOCK_BYTES, LogDevice, SimLog};
    use crate::wal::{self, LogOptions};

    fn put(k: u8) -> LogOp {
        LogOp::Put {
            keyspace: 1,
            key: vec![k],
            value: vec![k; 3],
        }
    }

    #[test]
    fn a_format_1_log_is_read_and_continued_in_format_2() -> std::io::Result<()> {
        // Segment 0 as the code before format 2 wrote it: a group of two records.
        let device = Arc::new(SimLog::new(1));
        let old = vec![
            LogRecord {
                seq: 0,
                ops: vec![put(1)],
            },
            LogRecord {
                seq: 1,
                ops: vec![
                    put(2),
                    LogOp::Delete {
                        keyspace: 2,
                        key: vec![1],
                    },
                ],
            },
        ];
        let mut stream = Vec::new();
        for r in &old {
            super::format::encode_record_v1(r.seq, &r.ops, &mut stream);
        }
        let header = SegmentHeader {
            format: 1,
            id: 0,
            first_block: 0,
            data_blocks: 8,
        };
        device.create(0, 9 * LOG_BLOCK_BYTES as u64)?;
        device.write_at(0, 0, &header.encode())?;
        let block_header = BlockHeader {
            segment: 0,
            address: 0,
            durable_horizon: 0,
            used: stream.len(),
            continued: 0,
        };
        device.write_at(
            0,
            LOG_BLOCK_BYTES as u64,
            &encode_block(&block_header, &stream),
        )?;
        device.sync(0)?;

        let (log, recovered) = wal::open(device.clone(), LogOptions::default())?;
        assert_eq!(recovered.records, old);
        let seq = log.append(&[put(3)])?;
        assert_eq!(seq, 2);
        log.wait_durable(seq)?;
        drop(log);

        // Both segments read back after a crash, the new one in this code's format.
        let crashed = Arc::new(device.crash());
        let (_, again) = wal::open(crashed.clone(), LogOptions::default())?;
        let mut all = old;
        all.push(LogRecord {
            seq: 2,
            ops: vec![put(3)],
        });
        assert_eq!(again.records, all);
        let mut first = vec![0u8; LOG_BLOCK_BYTES];
        let ids = crashed.list()?;
        assert_eq!(ids.len(), 2, "{ids:?}");
        crashed.read_at(ids[1], 0, &mut first)?;
        let newest =
            SegmentHeader::decode(&first).map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        assert_eq!(newest.format, super::format::FORMAT_VERSION);
        Ok(())
    }
}
