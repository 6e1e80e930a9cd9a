//! The write-ahead log: checksummed records with sequence numbers, appended with group
//! commit to preallocated 4 KiB-block segments on a [`LogDevice`] (retired segments
//! recycled as spares), and read back on open up to a torn or stale tail.
//!
//! This is the log the database directory's durability is built on ([`crate::Db`]
//! writes through it, and truncates it behind its checkpoints); it is public for the
//! tests and for those who build on it. The formats are in `format.rs` (and
//! `docs/design.md`), group commit in `writer.rs`, recovery's reading in `reader.rs`.
//!
//! ```
//! use std::sync::Arc;
//! use bfdb::storage::SimLog;
//! use bfdb::wal::{self, LogOp, LogOptions};
//!
//! let device = Arc::new(SimLog::new(7));
//! let (log, _) = wal::open(device.clone(), LogOptions::default())?;
//! let seq = log.append(&[LogOp::Put { keyspace: 1, key: b"k".to_vec(), value: b"v".to_vec() }])?;
//! log.wait_durable(seq)?;
//!
//! // What a restarted process finds: the synced record.
//! let (_, recovered) = wal::open(Arc::new(device.crash()), LogOptions::default())?;
//! assert_eq!(recovered.records.len(), 1);
//! # Ok::<(), std::io::Error>(())
//! ```

mod format;
mod reader;
mod writer;

use std::io;
use std::sync::Arc;

use crate::storage::{LOG_BLOCK_BYTES, LogDevice};

pub(crate) use format::Cursor;
pub use format::{LogOp, LogOpRef, LogRecord};
pub use reader::Recovered;
pub use writer::{Flusher, Log, LogOptions, MAX_GATHER, MAX_SPARE_SEGMENTS, Preparer};

/// Where the log begins for a recovery: a block address at or below the first block
/// that can hold a record of sequence number `seq` or later, and that number. Records
/// below `seq` are older than the position and not returned. A checkpoint records the
/// position of the log when it started ([`Log::position`]); the default is the start of
/// a log never truncated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogPosition {
    /// The block address the log is read from.
    pub block: u64,
    /// The first sequence number that counts.
    pub seq: u64,
}

/// Reads the whole log on `device` and opens it for appending: [`open_at`] the start.
pub fn open(device: Arc<dyn LogDevice>, options: LogOptions) -> io::Result<(Log, Recovered)> {
    open_at(device, options, LogPosition::default())
}

/// Reads the log on `device` from `start` (every complete record from there, and what
/// was discarded at a torn tail), and returns a [`Log`] that appends after it, in a new
/// segment that starts past the last valid block, so that nothing after a torn block is
/// ever read again. Sequence numbers go on from the last record read, and never below
/// `start.seq`. Spares on the device of the usual segment length are kept for reuse (up
/// to [`MAX_SPARE_SEGMENTS`]); others are removed. New segments get ids above every
/// segment and spare on the device, so no block of a spare can pass for one of them.
pub fn open_at(
    device: Arc<dyn LogDevice>,
    options: LogOptions,
    start: LogPosition,
) -> io::Result<(Log, Recovered)> {
    let mut recovered = reader::read_log(&*device, start.block)?;
    recovered.records.retain(|r| r.seq >= start.seq);
    if recovered.discarded_bytes > 0 {
        log::warn!(
            "bfdb: the write-ahead log ended in a torn tail: {} bytes and {} records discarded",
            recovered.discarded_bytes,
            recovered.discarded_records
        );
    }
    // What recovery read may sit only in the OS page cache (the last process died
    // between a group's write and its sync): make it durable before anything is
    // appended, since new groups' durable horizons will vouch for every block read.
    for &id in &recovered.abandoned {
        device.remove(id)?;
    }
    for id in device.list()? {
        device.sync(id)?;
    }
    let next_seq = recovered
        .records
        .last()
        .map_or(1, |r| r.seq + 1)
        .max(start.seq)
        .max(1);
    let spares = device.spares()?;
    let next_segment_id = device
        .list()?
        .last()
        .copied()
        .into_iter()
        .chain(spares.iter().map(|&(id, _)| id))
        .max()
        .map_or(1, |id| id + 1);
    let mut kept = Vec::new();
    for (id, len_bytes) in spares {
        if len_bytes == (options.segment_blocks + 1) * LOG_BLOCK_BYTES as u64
            && kept.len() < MAX_SPARE_SEGMENTS
        {
            kept.push(id);
        } else {
            device.remove_spare(id)?;
        }
    }
    let log = Log::new(
        device,
        options,
        next_seq,
        next_segment_id,
        recovered.next_block,
    );
    log.adopt_spares(kept);
    Ok((log, recovered))
}
