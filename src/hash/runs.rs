//! Hash-ordered runs: the cold tier laid out so that a key's record is found with one
//! device read and under half a byte of memory per key (issue #35, item 3).
//!
//! F2 keeps cold records in a log and finds them through a two-level index whose hash
//! chunks live on disk: a cold miss reads the key's chunk, then walks a chain that may
//! pass through other keys' records (about 2.5 reads per miss measured), and every record
//! compaction moves cold costs a read-modify-write of its chunk. A run instead holds
//! records sorted by key hash (then key) in pages of 4 KiB, and the first hash of each
//! page — its fence — stays in memory: 8 bytes a page, about a quarter of a byte per key
//! of 8 + 100 bytes. A lookup binary-searches the fences and reads the one unit that can
//! hold the key. Runs are written sequentially and never changed, and a set of them
//! (newest first) is merged into one, sequentially, instead of updating an index record by
//! record. A run that is not the last level (a *delta*) also keeps a Bloom filter of its
//! keys' hashes in memory (10 bits a key), so a lookup reads only the runs that may hold
//! the key.
//!
//! ## On the device
//!
//! A run occupies `[start, end)` of a [`BlockDevice`]'s address space, page aligned:
//!
//! ```text
//!  start                                                               end
//!    │ data units (pages of records)  │ fences │ filter │ footer (1 page) │
//! ```
//!
//! - A **unit** is one page, or several when one record (a long key) or the records of
//!   one hash do not fit in a page. Its first 8 bytes are a header: the CRC-32C of the
//!   unit's bytes from offset 4 to its end (`u32`), the count of records (`u16`) and the
//!   unit's span in pages (`u16`); the records follow, zero bytes after them.
//! - A **record** is a 16-byte header — the key's hash (`u64`), the key's length (`u16`),
//!   flags (`u8`: 1 a tombstone, 2 a value kept out of line as its reference), a zero
//!   byte, the value's length (`u32`) — then the key and the value. Records are in
//!   strictly increasing (hash, key) order across the run, and the records of one hash
//!   are never split between units (so a hash's records are in exactly one unit).
//! - **Fences**: one `u64` per data page, the hash of the first record of the page's
//!   unit (a unit's later pages repeat it: two equal neighbouring fences mean one unit).
//!   Because a unit's first hash is above every hash of the unit before it, the unit
//!   that may hold hash `h` is the one of the last page whose fence is at most `h`.
//! - **Filter**: a delta's Bloom filter, its bits as `u64` words.
//! - **Footer**: magic, format version, counts and the CRC-32C of the fence and filter
//!   pages, then its own CRC. Opening a run reads the footer and the pages before it;
//!   the data pages are read only by lookups and merges.
//!
//! A run's bytes never change after [`RunWriter::finish`]; a run stops being used when a
//! merge has replaced it, and its space is given back by truncating the device below the
//! oldest run still in use.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use super::record::LogValue;
use crate::error::{Error, Result};
use crate::storage::{AlignedBuf, BlockDevice, IO_ALIGN_BYTES};

/// A run's page: the unit of fences, and of device reads.
pub(crate) const PAGE_BYTES: usize = 4096;
/// A unit's header: CRC-32C, record count, span in pages.
const UNIT_HEADER_BYTES: usize = 8;
/// A record's header: hash, key length, flags, a zero byte, value length.
pub(crate) const RECORD_HEADER_BYTES: usize = 16;
/// The most pages one unit may span (a `u16`, and what the writer buffers at once).
const MAX_UNIT_PAGES: usize = 1024;
const FLAG_TOMBSTONE: u8 = 1;
const FLAG_OUT_OF_LINE: u8 = 2;
const FOOTER_MAGIC: u64 = u64::from_le_bytes(*b"bfdbRUN\0");
/// Version 2: blocked filters (version 1's are read too).
const FORMAT_VERSION: u32 = 2;
/// A delta's filter: bits per key and probes per lookup (about 1% false positives).
const FILTER_BITS_PER_KEY: u64 = 10;
const FILTER_PROBES: u32 = 7;
/// Pages a writer gathers before one device write, and a merge reads of a run at once.
const IO_CHUNK_PAGES: usize = 64;

/// A record of a run: its key's hash, the key, and the value as the record holds it
/// (`None`: a tombstone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RunRecord {
    pub(crate) hash: u64,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Option<LogValue>,
}

/// Whether a run holds every version that matters of its keys (the base, where a
/// tombstone can be dropped) or is a delta over older runs (which keeps tombstones and a
/// filter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RunKind {
    Base,
    Delta,
}

// ---------------------------------------------------------------------------------------
// The Bloom filter of a delta
// ---------------------------------------------------------------------------------------

/// A Bloom filter over key hashes. From format version 2 it is blocked (Putze, Sanders
/// and Singler, "Cache-, hash- and space-efficient Bloom filters", 2007): a key's
/// probes all fall in one 512-bit block, so a lookup that asks a partition's deltas
/// costs a cache miss per delta rather than one per probe, for a slightly higher false
/// positive rate (about 1.0% rather than 0.8% at 10 bits per key). Runs of version 1
/// keep their filter of double hashing over the whole filter.
#[derive(Debug)]
struct Filter {
    words: Box<[u64]>,
    /// Probes within one block ([`Filter::BLOCK_WORDS`] words): the version 2 layout.
    blocked: bool,
}

impl Filter {
    /// Words of one block: a cache line.
    const BLOCK_WORDS: usize = 8;

    fn with_keys(keys: u64) -> Filter {
        let bits =
            (keys.max(1) * FILTER_BITS_PER_KEY).next_multiple_of(64 * Self::BLOCK_WORDS as u64);
        Filter {
            words: vec![0; (bits / 64) as usize].into_boxed_slice(),
            blocked: true,
        }
    }

    /// The filter of a run of `version` whose words are `words`.
    fn of_version(words: Box<[u64]>, version: u32) -> Filter {
        Filter {
            blocked: version >= 2,
            words,
        }
    }

    fn bits(&self) -> u64 {
        self.words.len() as u64 * 64
    }

    /// The bit positions of `hash` (as bit indexes into the words).
    fn probes(&self, hash: u64) -> impl Iterator<Item = u64> + use<> {
        let bits = self.bits();
        // Version 1: double hashing over the whole filter from the hash's halves.
        let (a, b) = (hash, hash.rotate_left(32) | 1);
        // Version 2: the block from the top of one mix of the hash (a run holds one
        // partition's hashes, whose top bits are alike: they must not pick the block
        // directly), seven 9-bit positions in it from another.
        let blocks = bits / 512;
        let block = if self.blocked {
            let mixed = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            ((u128::from(mixed) * u128::from(blocks)) >> 64) as u64 * 512
        } else {
            0
        };
        let spread = (hash ^ (hash >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let blocked = self.blocked;
        (0..u64::from(FILTER_PROBES)).map(move |i| {
            if blocked {
                block + ((spread >> (i * 9)) & 511)
            } else {
                a.wrapping_add(i.wrapping_mul(b)) % bits
            }
        })
    }

    fn insert(&mut self, hash: u64) {
        for bit in self.probes(hash) {
            self.words[(bit / 64) as usize] |= 1 << (bit % 64);
        }
    }

    fn may_contain(&self, hash: u64) -> bool {
        self.probes(hash)
            .all(|bit| self.words[(bit / 64) as usize] & (1 << (bit % 64)) != 0)
    }
}

// ---------------------------------------------------------------------------------------
// Units
// ---------------------------------------------------------------------------------------

/// The little-endian `u64` at `at` of `bytes`.
pub(crate) fn le_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// The little-endian `u32` at `at` of `bytes`.
pub(crate) fn le_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// `bytes` as little-endian `u64` words (fences, a filter's bits).
fn le_words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes.chunks_exact(8).map(|w| le_u64(w, 0))
}

/// The CRC a unit's header holds: of its bytes from offset 4 on.
fn unit_crc(unit: &[u8]) -> u32 {
    crc32c::crc32c(&unit[4..])
}

/// The span in pages of the unit whose first page is `page`, from its header (unchecked).
fn unit_span(page: &[u8]) -> usize {
    usize::from(u16::from_le_bytes([page[6], page[7]]))
}

/// The records of `unit` (its whole span), checked: the CRC, each record within the
/// unit, flags known, records in increasing order. `Err` says what is wrong.
fn decode_unit(unit: &[u8]) -> std::result::Result<Vec<RunRecord>, String> {
    let mut records = Vec::new();
    for_each_record(unit, |r| {
        records.push(r.to_owned());
        true
    })?;
    Ok(records)
}

/// A record of a unit, borrowed from the unit's bytes.
struct RecordRef<'a> {
    hash: u64,
    key: &'a [u8],
    flags: u8,
    value: &'a [u8],
}

impl RecordRef<'_> {
    fn value(&self) -> Option<LogValue> {
        (self.flags & FLAG_TOMBSTONE == 0).then(|| LogValue {
            bytes: self.value.to_vec(),
            out_of_line: self.flags & FLAG_OUT_OF_LINE != 0,
        })
    }

    fn to_owned(&self) -> RunRecord {
        RunRecord {
            hash: self.hash,
            key: self.key.to_vec(),
            value: self.value(),
        }
    }
}

/// Checks `unit` and calls `f` on its records in order until `f` answers false.
fn for_each_record<'a>(
    unit: &'a [u8],
    mut f: impl FnMut(&RecordRef<'a>) -> bool,
) -> std::result::Result<(), String> {
    if unit.len() < PAGE_BYTES || !unit.len().is_multiple_of(PAGE_BYTES) {
        return Err(format!("a run unit of {} bytes", unit.len()));
    }
    let span = unit_span(unit);
    if span * PAGE_BYTES != unit.len() {
        return Err(format!(
            "a run unit of {span} pages read as {} bytes",
            unit.len()
        ));
    }
    let stored = le_u32(unit, 0);
    if stored != unit_crc(unit) {
        return Err("a run unit failed its checksum".into());
    }
    let count = usize::from(u16::from_le_bytes([unit[4], unit[5]]));
    let mut at = UNIT_HEADER_BYTES;
    let mut previous: Option<(u64, &[u8])> = None;
    for i in 0..count {
        let Some(header) = unit.get(at..at + RECORD_HEADER_BYTES) else {
            return Err(format!("record {i} of a run unit starts past its end"));
        };
        let hash = le_u64(header, 0);
        let key_len = usize::from(u16::from_le_bytes([header[8], header[9]]));
        let flags = header[10];
        let value_len = le_u32(header, 12) as usize;
        if flags & !(FLAG_TOMBSTONE | FLAG_OUT_OF_LINE) != 0 || header[11] != 0 {
            return Err(format!(
                "record {i} of a run unit has unknown flags {flags:#x}"
            ));
        }
        let key_at = at + RECORD_HEADER_BYTES;
        let end = key_at + key_len + value_len;
        if end > unit.len() {
            return Err(format!("record {i} of a run unit runs past its end"));
        }
        let record = RecordRef {
            hash,
            key: &unit[key_at..key_at + key_len],
            flags,
            value: &unit[key_at + key_len..end],
        };
        if previous.is_some_and(|p| p >= (hash, record.key)) {
            return Err(format!("record {i} of a run unit is out of order"));
        }
        previous = Some((hash, record.key));
        if !f(&record) {
            return Ok(());
        }
        at = end;
    }
    Ok(())
}

/// What a unit holds for `key` (of hash `hash`): `None` if no record, `Some(None)` a
/// tombstone, else the value. `Err` if the unit does not check.
pub(crate) fn find_in_unit(
    unit: &[u8],
    hash: u64,
    key: &[u8],
) -> std::result::Result<Option<Option<LogValue>>, String> {
    let mut found = None;
    for_each_record(unit, |r| match (r.hash, r.key).cmp(&(hash, key)) {
        Ordering::Less => true,
        Ordering::Equal => {
            found = Some(r.value());
            false
        }
        Ordering::Greater => false,
    })?;
    Ok(found)
}

// ---------------------------------------------------------------------------------------
// A run in memory
// ---------------------------------------------------------------------------------------

/// A run as the cold tier keeps it in memory: where it lies, its fences and its filter.
#[derive(Debug)]
pub(crate) struct Run {
    start: u64,
    end: u64,
    records: u64,
    /// The first hash of each data page's unit.
    fences: Box<[u64]>,
    filter: Option<Filter>,
}

/// Where a unit lies: its device address and length in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UnitAt {
    pub(crate) address: u64,
    pub(crate) len: usize,
}

impl Run {
    /// The run's extent on its device.
    pub(crate) fn extent(&self) -> (u64, u64) {
        (self.start, self.end)
    }

    /// A delta if it has a filter (only deltas do), else a base.
    pub(crate) fn kind(&self) -> RunKind {
        match self.filter {
            Some(_) => RunKind::Delta,
            None => RunKind::Base,
        }
    }

    /// Records in the run, tombstones included.
    pub(crate) fn records(&self) -> u64 {
        self.records
    }

    /// Data pages (the bytes a full read of its records takes, over 4 KiB).
    pub(crate) fn data_pages(&self) -> u64 {
        self.fences.len() as u64
    }

    /// The memory the run's fences and filter take.
    pub(crate) fn memory_bytes(&self) -> u64 {
        let filter = self.filter.as_ref().map_or(0, |f| f.words.len() * 8);
        (self.fences.len() * 8 + filter + std::mem::size_of::<Run>()) as u64
    }

    /// False if the run holds no record of `hash` (by its filter; a base always may).
    pub(crate) fn may_contain(&self, hash: u64) -> bool {
        self.filter.as_ref().is_none_or(|f| f.may_contain(hash))
    }

    /// The unit that holds the records of `hash` if the run has any: `None` if the hash is
    /// below the first fence (or the run is empty).
    pub(crate) fn locate(&self, hash: u64) -> Option<UnitAt> {
        let fences = &self.fences;
        let after = fences.partition_point(|&f| f <= hash);
        if after == 0 {
            return None;
        }
        let mut first = after - 1;
        while first > 0 && fences[first - 1] == fences[first] {
            first -= 1;
        }
        let mut last = after;
        while last < fences.len() && fences[last] == fences[first] {
            last += 1;
        }
        Some(UnitAt {
            address: self.start + (first * PAGE_BYTES) as u64,
            len: (last - first) * PAGE_BYTES,
        })
    }

    /// Looks `key` (of hash `hash`) up in the run with a blocking read: `None` if the run
    /// holds no record of it, `Some(None)` a tombstone.
    pub(crate) fn get(
        &self,
        device: &dyn BlockDevice,
        hash: u64,
        key: &[u8],
    ) -> Result<Option<Option<LogValue>>> {
        if !self.may_contain(hash) {
            return Ok(None);
        }
        let Some(unit) = self.locate(hash) else {
            return Ok(None);
        };
        read_unit(device, unit, hash, key)
    }

    /// Reads the run back from `[start, end)` of `device`: its footer, fences and filter,
    /// checked. The data pages are not read.
    pub(crate) fn open(device: &dyn BlockDevice, start: u64, end: u64) -> Result<Run> {
        let page = PAGE_BYTES as u64;
        if !start.is_multiple_of(page) || !end.is_multiple_of(page) || end < start + page {
            return Err(corrupt(
                device,
                start,
                &format!("a run at [{start}, {end}) is not whole pages"),
            ));
        }
        let footer_at = end - page;
        let mut footer = AlignedBuf::new(PAGE_BYTES);
        read_split(device, footer_at, footer.as_mut())?;
        let footer =
            Footer::decode(footer.as_ref()).map_err(|why| corrupt(device, footer_at, &why))?;
        let meta_pages = footer.fence_pages + footer.filter_pages;
        let expected_end = start + (footer.data_pages + meta_pages + 1) * page;
        if expected_end != end {
            return Err(corrupt(
                device,
                footer_at,
                &format!(
                    "a run's footer gives it {expected_end} - {start} bytes, not {end} - {start}"
                ),
            ));
        }
        let meta_at = start + footer.data_pages * page;
        let mut meta = AlignedBuf::new((meta_pages * page).max(page) as usize);
        let meta_bytes = &mut meta.as_mut()[..(meta_pages * page) as usize];
        read_split(device, meta_at, meta_bytes)?;
        if crc32c::crc32c(meta_bytes) != footer.meta_crc {
            return Err(corrupt(
                device,
                meta_at,
                "a run's fences or filter failed their checksum",
            ));
        }
        let fence_bytes = &meta_bytes[..(footer.data_pages * 8) as usize];
        let fences: Box<[u64]> = le_words(fence_bytes).collect();
        if fences.windows(2).any(|w| w[0] > w[1]) {
            return Err(corrupt(device, meta_at, "a run's fences are out of order"));
        }
        let filter = (footer.filter_words > 0).then(|| {
            let at = (footer.fence_pages * page) as usize;
            Filter::of_version(
                le_words(&meta_bytes[at..at + (footer.filter_words * 8) as usize]).collect(),
                footer.version,
            )
        });
        Ok(Run {
            start,
            end,
            records: footer.records,
            fences,
            filter,
        })
    }

    /// The run's records in order, read sequentially.
    pub(crate) fn scan<'d>(&self, device: &'d dyn BlockDevice) -> RunScan<'d> {
        RunScan {
            device,
            start: self.start,
            pages: self.fences.len(),
            next_page: 0,
            pending: VecDeque::new(),
        }
    }
}

/// What the unit at `unit` holds for `key` (of hash `hash`), read with a blocking read:
/// as [`find_in_unit`], the unit's damage an error naming its file.
pub(crate) fn read_unit(
    device: &dyn BlockDevice,
    unit: UnitAt,
    hash: u64,
    key: &[u8],
) -> Result<Option<Option<LogValue>>> {
    let mut buf = AlignedBuf::new(unit.len);
    read_split(device, unit.address, buf.as_mut())?;
    find_in_unit(buf.as_ref(), hash, key).map_err(|why| corrupt(device, unit.address, &why))
}

/// The error for a run's bytes at `address` that do not check, naming their file.
pub(crate) fn corrupt(device: &dyn BlockDevice, address: u64, why: &str) -> Error {
    device.damaged(address, format!("cold run at address {address}: {why}"))
}

/// Whether `len` bytes at `address` lie in one of the device's segments (one read).
pub(crate) fn within_segment(device: &dyn BlockDevice, address: u64, len: usize) -> bool {
    device.segment_piece(address, len as u64) == len as u64
}

/// Reads `buf` at `address`, split where the device's segments end.
pub(crate) fn read_split(device: &dyn BlockDevice, address: u64, buf: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let at = address + done as u64;
        let len = device.segment_piece(at, (buf.len() - done) as u64) as usize;
        device.read(at, &mut buf[done..done + len])?;
        done += len;
    }
    Ok(())
}

/// Writes `bytes` at `address`, split where the device's segments end.
pub(crate) fn write_split(device: &dyn BlockDevice, address: u64, bytes: &[u8]) -> Result<()> {
    let mut done = 0;
    while done < bytes.len() {
        let at = address + done as u64;
        let len = device.segment_piece(at, (bytes.len() - done) as u64) as usize;
        device.write(at, &bytes[done..done + len])?;
        done += len;
    }
    Ok(())
}

/// A run's last page.
struct Footer {
    /// The format version the run was written in (the writer: [`FORMAT_VERSION`] for a
    /// run with a filter, 1 for one without, whose layout version 2 did not change).
    version: u32,
    data_pages: u64,
    fence_pages: u64,
    filter_pages: u64,
    filter_words: u64,
    records: u64,
    meta_crc: u32,
}

impl Footer {
    const BYTES: usize = 64;

    fn encode(&self, page: &mut [u8]) {
        page.fill(0);
        page[0..8].copy_from_slice(&FOOTER_MAGIC.to_le_bytes());
        page[8..12].copy_from_slice(&self.version.to_le_bytes());
        page[12..16].copy_from_slice(&self.meta_crc.to_le_bytes());
        page[16..24].copy_from_slice(&self.data_pages.to_le_bytes());
        page[24..32].copy_from_slice(&self.fence_pages.to_le_bytes());
        page[32..40].copy_from_slice(&self.filter_pages.to_le_bytes());
        page[40..48].copy_from_slice(&self.filter_words.to_le_bytes());
        page[48..56].copy_from_slice(&self.records.to_le_bytes());
        let crc = crc32c::crc32c(&page[..Footer::BYTES - 4]);
        page[Footer::BYTES - 4..Footer::BYTES].copy_from_slice(&crc.to_le_bytes());
    }

    fn decode(page: &[u8]) -> std::result::Result<Footer, String> {
        let u64_at = |at| le_u64(page, at);
        let u32_at = |at| le_u32(page, at);
        if u64_at(0) != FOOTER_MAGIC {
            return Err("no run footer where one should end the run".into());
        }
        if u32_at(Footer::BYTES - 4) != crc32c::crc32c(&page[..Footer::BYTES - 4]) {
            return Err("a run's footer failed its checksum".into());
        }
        let version = u32_at(8);
        if !(1..=FORMAT_VERSION).contains(&version) {
            return Err(format!(
                "a run of format version {version}; this build reads {FORMAT_VERSION}"
            ));
        }
        let footer = Footer {
            version,
            meta_crc: u32_at(12),
            data_pages: u64_at(16),
            fence_pages: u64_at(24),
            filter_pages: u64_at(32),
            filter_words: u64_at(40),
            records: u64_at(48),
        };
        let page = PAGE_BYTES as u64;
        let fits = footer.data_pages.checked_mul(8).map(|b| b.div_ceil(page))
            == Some(footer.fence_pages)
            && footer.filter_words.checked_mul(8).map(|b| b.div_ceil(page))
                == Some(footer.filter_pages)
            && footer.data_pages < 1 << 40
            && (version < 2
                || footer
                    .filter_words
                    .is_multiple_of(Filter::BLOCK_WORDS as u64));
        if !fits {
            return Err("a run's footer gives inconsistent sizes".into());
        }
        Ok(footer)
    }
}

// ---------------------------------------------------------------------------------------
// Writing a run
// ---------------------------------------------------------------------------------------

/// Writes a run at `start` of a device from records given in increasing (hash, key)
/// order. Nothing names the run until [`RunWriter::finish`] returns it, and the caller
/// syncs the device before anything durable names it.
pub(crate) struct RunWriter<'d> {
    device: &'d dyn BlockDevice,
    start: u64,
    /// Pages written to the device so far.
    written_pages: u64,
    /// Whole units not written yet, `IO_CHUNK_PAGES` at most (or one larger unit).
    out: Vec<u8>,
    /// The unit being filled: its bytes (a whole number of pages), records and first
    /// hash.
    unit: Vec<u8>,
    unit_used: usize,
    unit_records: usize,
    unit_first_hash: u64,
    last: Option<(u64, Vec<u8>)>,
    fences: Vec<u64>,
    filter: Option<Filter>,
    records: u64,
}

impl<'d> RunWriter<'d> {
    /// A writer of a run at `start` (page aligned). A delta's filter is sized for
    /// `expected_records` (more records only raise its false positives).
    pub(crate) fn new(
        device: &'d dyn BlockDevice,
        start: u64,
        kind: RunKind,
        expected_records: u64,
    ) -> RunWriter<'d> {
        assert!(
            start.is_multiple_of(IO_ALIGN_BYTES),
            "a run starts on a page"
        );
        RunWriter {
            device,
            start,
            written_pages: 0,
            out: Vec::with_capacity(IO_CHUNK_PAGES * PAGE_BYTES),
            unit: vec![0; PAGE_BYTES],
            unit_used: UNIT_HEADER_BYTES,
            unit_records: 0,
            unit_first_hash: 0,
            last: None,
            fences: Vec::new(),
            filter: (kind == RunKind::Delta).then(|| Filter::with_keys(expected_records)),
            records: 0,
        }
    }

    /// Appends a record; records come in strictly increasing (hash, key) order.
    pub(crate) fn push(&mut self, record: &RunRecord) -> Result<()> {
        let value = record
            .value
            .as_ref()
            .map(|v| (v.bytes.as_slice(), v.out_of_line));
        self.push_parts(record.hash, &record.key, value)
    }

    /// [`RunWriter::push`] of a record given by its parts: its hash, key, and value
    /// (`None` a tombstone; with whether it is out of line).
    pub(crate) fn push_parts(
        &mut self,
        hash: u64,
        key: &[u8],
        value: Option<(&[u8], bool)>,
    ) -> Result<()> {
        let value_len = value.map_or(0, |(v, _)| v.len());
        if let Some((last_hash, last_key)) = &self.last
            && (hash, key) <= (*last_hash, last_key.as_slice())
        {
            panic!("run records out of order: {hash}/{key:?} after {last_hash}/{last_key:?}");
        }
        let bytes = RECORD_HEADER_BYTES + key.len() + value_len;
        if UNIT_HEADER_BYTES + bytes > MAX_UNIT_PAGES * PAGE_BYTES
            || key.len() > usize::from(u16::MAX)
            || u32::try_from(value_len).is_err()
        {
            return Err(Error::Unsupported(format!(
                "a cold record of {bytes} bytes (key {} bytes) does not fit a run unit",
                key.len()
            )));
        }
        let same_hash = self.last.as_ref().is_some_and(|(h, _)| *h == hash);
        if self.unit_used + bytes > self.unit.len() {
            if self.unit_records > 0 && !same_hash {
                self.close_unit()?;
            }
            // Grow the unit (a long record, or one more record of the unit's last hash).
            let need = (self.unit_used + bytes).next_multiple_of(PAGE_BYTES);
            if need > MAX_UNIT_PAGES * PAGE_BYTES {
                return Err(Error::Unsupported(format!(
                    "the cold records of one hash take more than {MAX_UNIT_PAGES} pages"
                )));
            }
            self.unit.resize(need, 0);
        }
        if self.unit_records == 0 {
            self.unit_first_hash = hash;
        }
        let at = self.unit_used;
        encode_record(&mut self.unit[at..at + bytes], hash, key, value);
        self.unit_used += bytes;
        self.unit_records += 1;
        if self.unit_records > usize::from(u16::MAX) {
            return Err(Error::Unsupported(
                "more than 65,535 cold records of one hash".into(),
            ));
        }
        self.records += 1;
        if let Some(filter) = &mut self.filter {
            filter.insert(hash);
        }
        match &mut self.last {
            Some((last_hash, last_key)) => {
                *last_hash = hash;
                last_key.clear();
                last_key.extend_from_slice(key);
            }
            None => self.last = Some((hash, key.to_vec())),
        }
        Ok(())
    }

    /// Ends the unit being filled: its header, its fences, its bytes to the output.
    fn close_unit(&mut self) -> Result<()> {
        if self.unit_records == 0 {
            return Ok(());
        }
        let span = self.unit.len() / PAGE_BYTES;
        self.unit[4..6].copy_from_slice(&(self.unit_records as u16).to_le_bytes());
        self.unit[6..8].copy_from_slice(&(span as u16).to_le_bytes());
        let crc = unit_crc(&self.unit);
        self.unit[0..4].copy_from_slice(&crc.to_le_bytes());
        self.fences
            .extend(std::iter::repeat_n(self.unit_first_hash, span));
        if self.out.len() + self.unit.len() > IO_CHUNK_PAGES * PAGE_BYTES {
            self.flush()?;
        }
        self.out.extend_from_slice(&self.unit);
        self.unit.clear();
        self.unit.resize(PAGE_BYTES, 0);
        self.unit_used = UNIT_HEADER_BYTES;
        self.unit_records = 0;
        Ok(())
    }

    /// Writes the gathered units.
    fn flush(&mut self) -> Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let mut buf = AlignedBuf::new(self.out.len());
        buf.as_mut().copy_from_slice(&self.out);
        let at = self.start + self.written_pages * PAGE_BYTES as u64;
        write_split(self.device, at, buf.as_ref())?;
        self.written_pages += (self.out.len() / PAGE_BYTES) as u64;
        self.out.clear();
        Ok(())
    }

    /// Writes the rest of the records, the fences, the filter and the footer; the run
    /// ends at the returned run's `extent().1`. The device is not synced.
    pub(crate) fn finish(mut self) -> Result<Run> {
        self.close_unit()?;
        self.flush()?;
        let page = PAGE_BYTES as u64;
        let data_pages = self.fences.len() as u64;
        let fence_pages = (data_pages * 8).div_ceil(page);
        let filter_words = self.filter.as_ref().map_or(0, |f| f.words.len() as u64);
        let filter_pages = (filter_words * 8).div_ceil(page);
        let meta_len = ((fence_pages + filter_pages) * page) as usize;
        let mut meta = AlignedBuf::new(meta_len + PAGE_BYTES);
        let bytes = meta.as_mut();
        for (i, fence) in self.fences.iter().enumerate() {
            bytes[i * 8..i * 8 + 8].copy_from_slice(&fence.to_le_bytes());
        }
        if let Some(filter) = &self.filter {
            let at = (fence_pages * page) as usize;
            for (i, word) in filter.words.iter().enumerate() {
                bytes[at + i * 8..at + i * 8 + 8].copy_from_slice(&word.to_le_bytes());
            }
        }
        let footer = Footer {
            // A run without a filter (a base) is as version 1 wrote it: builds before
            // the blocked filters still read it.
            version: if filter_words > 0 { FORMAT_VERSION } else { 1 },
            data_pages,
            fence_pages,
            filter_pages,
            filter_words,
            records: self.records,
            meta_crc: crc32c::crc32c(&bytes[..meta_len]),
        };
        footer.encode(&mut bytes[meta_len..]);
        let meta_at = self.start + data_pages * page;
        write_split(self.device, meta_at, meta.as_ref())?;
        let end = meta_at + meta.as_ref().len() as u64;
        Ok(Run {
            start: self.start,
            end,
            records: self.records,
            fences: self.fences.into_boxed_slice(),
            filter: self.filter,
        })
    }
}

/// Writes the record (`hash`, `key`, `value`) into `out`, exactly its encoded length.
fn encode_record(out: &mut [u8], hash: u64, key: &[u8], value: Option<(&[u8], bool)>) {
    let value_len = value.map_or(0, |(v, _)| v.len());
    debug_assert_eq!(out.len(), RECORD_HEADER_BYTES + key.len() + value_len);
    out[0..8].copy_from_slice(&hash.to_le_bytes());
    out[8..10].copy_from_slice(&(key.len() as u16).to_le_bytes());
    out[10] = match value {
        None => FLAG_TOMBSTONE,
        Some((_, true)) => FLAG_OUT_OF_LINE,
        Some((_, false)) => 0,
    };
    out[11] = 0;
    out[12..16].copy_from_slice(&(value_len as u32).to_le_bytes());
    let key_end = RECORD_HEADER_BYTES + key.len();
    out[RECORD_HEADER_BYTES..key_end].copy_from_slice(key);
    if let Some((v, _)) = value {
        out[key_end..].copy_from_slice(v);
    }
}

/// A value as [`RunWriter::push_parts`] takes it: its bytes and whether they are a
/// reference to a value out of line.
type ValueParts<'a> = (&'a [u8], bool);

/// The parts of a record encoded by [`encode_record`]: hash, key, value.
fn record_parts(bytes: &[u8]) -> (u64, &[u8], Option<ValueParts<'_>>) {
    let hash = le_u64(bytes, 0);
    let key_len = usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
    let key = &bytes[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + key_len];
    let value = (bytes[10] & FLAG_TOMBSTONE == 0).then(|| {
        (
            &bytes[RECORD_HEADER_BYTES + key_len..],
            bytes[10] & FLAG_OUT_OF_LINE != 0,
        )
    });
    (hash, key, value)
}

/// The buffers [`Gathered`] encodes records into: each its own mapping, given back when
/// the gathering is dropped.
const GATHER_CHUNK_BYTES: usize = 4 << 20;

/// Records gathered for one run in any order (what a hot→cold pass collects from its
/// threads before it writes its delta), encoded as a run holds them in large buffers,
/// with an index to sort them by. Owned records (two heap blocks each) left the
/// compaction threads' allocator arenas holding tens of MiB after every pass.
#[derive(Default)]
pub(crate) struct Gathered {
    chunks: Vec<AlignedBuf>,
    /// Bytes used in the last chunk.
    used: usize,
    entries: Vec<GatheredEntry>,
    bytes: u64,
}

/// Where a gathered record is, and the order it sorts in.
struct GatheredEntry {
    hash: u64,
    /// Orders two records of one key: the higher is kept (a hot-log address).
    source: u64,
    chunk: u32,
    offset: u32,
    len: u32,
}

impl Gathered {
    /// Adds a record of `key` (`value` `None`: a tombstone); of two records of one key,
    /// the one of the higher `source` goes into the run.
    pub(crate) fn push(&mut self, hash: u64, key: &[u8], value: Option<&LogValue>, source: u64) {
        let value = value.map(|v| (v.bytes.as_slice(), v.out_of_line));
        let len = RECORD_HEADER_BYTES + key.len() + value.map_or(0, |(v, _)| v.len());
        let room = self
            .chunks
            .last()
            .map_or(0, |c| c.as_ref().len() - self.used);
        if len > room {
            self.chunks.push(AlignedBuf::new(
                GATHER_CHUNK_BYTES.max(len.next_multiple_of(PAGE_BYTES)),
            ));
            self.used = 0;
        }
        let chunk = self.chunks.len() - 1;
        let offset = self.used;
        encode_record(
            &mut self.chunks[chunk].as_mut()[offset..offset + len],
            hash,
            key,
            value,
        );
        self.used += len;
        self.bytes += len as u64;
        self.entries.push(GatheredEntry {
            hash,
            source,
            chunk: chunk as u32,
            offset: offset as u32,
            len: len as u32,
        });
    }

    /// Records gathered (two of one key count twice).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The memory the gathering holds.
    pub(crate) fn memory_bytes(&self) -> u64 {
        (self.chunks.len() * GATHER_CHUNK_BYTES
            + self.entries.capacity() * std::mem::size_of::<GatheredEntry>()) as u64
    }

    fn record(&self, e: &GatheredEntry) -> &[u8] {
        let at = e.offset as usize;
        &self.chunks[e.chunk as usize].as_ref()[at..at + e.len as usize]
    }

    /// Writes the records as runs of `kind` from `at` of `device` on, one after another:
    /// one run per partition of the hash space that has records (`partition_of` says
    /// which; it must not decrease as the hash grows), each sorted, one record per key
    /// (the highest source's). Returns the runs with their partitions, and how many
    /// records they hold.
    pub(crate) fn write_runs(
        mut self,
        device: &dyn BlockDevice,
        at: u64,
        kind: RunKind,
        partition_of: impl Fn(u64) -> usize,
    ) -> Result<(Vec<(usize, Run)>, u64)> {
        let mut entries = std::mem::take(&mut self.entries);
        entries.sort_unstable_by(|a, b| {
            let (ka, kb) = (
                record_parts(self.record(a)).1,
                record_parts(self.record(b)).1,
            );
            (a.hash, ka, std::cmp::Reverse(a.source)).cmp(&(
                b.hash,
                kb,
                std::cmp::Reverse(b.source),
            ))
        });
        // Of the records of one key, the first (the highest source's) only.
        let mut kept: Vec<&GatheredEntry> = Vec::with_capacity(entries.len());
        for e in &entries {
            let (hash, key, _) = record_parts(self.record(e));
            let repeat = kept.last().is_some_and(|last| {
                let (h, k, _) = record_parts(self.record(last));
                (h, k) == (hash, key)
            });
            if !repeat {
                kept.push(e);
            }
        }
        let mut runs = Vec::new();
        let mut at = at;
        for part in kept.chunk_by(|a, b| partition_of(a.hash) == partition_of(b.hash)) {
            let mut writer = RunWriter::new(device, at, kind, part.len() as u64);
            for e in part {
                let (hash, key, value) = record_parts(self.record(e));
                writer.push_parts(hash, key, value)?;
            }
            let run = writer.finish()?;
            at = run.extent().1;
            runs.push((partition_of(part[0].hash), run));
        }
        Ok((runs, kept.len() as u64))
    }
}

// ---------------------------------------------------------------------------------------
// Reading a run in order, and merging runs
// ---------------------------------------------------------------------------------------

/// A run's records in order, read `IO_CHUNK_PAGES` at a time.
pub(crate) struct RunScan<'d> {
    device: &'d dyn BlockDevice,
    start: u64,
    pages: usize,
    next_page: usize,
    pending: VecDeque<RunRecord>,
}

impl RunScan<'_> {
    /// The next record, `None` at the run's end.
    pub(crate) fn next_record(&mut self) -> Result<Option<RunRecord>> {
        while self.pending.is_empty() && self.next_page < self.pages {
            self.read_chunk()?;
        }
        Ok(self.pending.pop_front())
    }

    /// Reads the next chunk of whole units and decodes their records.
    fn read_chunk(&mut self) -> Result<()> {
        let mut pages = IO_CHUNK_PAGES.min(self.pages - self.next_page);
        let mut buf = AlignedBuf::new(pages * PAGE_BYTES);
        let at = self.start + (self.next_page * PAGE_BYTES) as u64;
        read_split(self.device, at, buf.as_mut())?;
        // A unit longer than the chunk: read it whole.
        let first_span = unit_span(buf.as_ref());
        if first_span > pages && self.next_page + first_span <= self.pages {
            pages = first_span;
            buf = AlignedBuf::new(pages * PAGE_BYTES);
            read_split(self.device, at, buf.as_mut())?;
        }
        let bytes = buf.as_ref();
        let mut page = 0;
        while page < pages {
            let unit_at = at + (page * PAGE_BYTES) as u64;
            let span = unit_span(&bytes[page * PAGE_BYTES..]);
            if span == 0 || self.next_page + page + span > self.pages {
                return Err(corrupt(
                    self.device,
                    unit_at,
                    &format!("a run unit spans {span} pages"),
                ));
            }
            if page + span > pages {
                break; // continued in the next chunk
            }
            let unit = &bytes[page * PAGE_BYTES..(page + span) * PAGE_BYTES];
            let records = decode_unit(unit).map_err(|why| corrupt(self.device, unit_at, &why))?;
            self.pending.extend(records);
            page += span;
        }
        self.next_page += page;
        Ok(())
    }
}

/// One input's head in a merge: ordered by (hash, key), then newest input first, as a
/// min-heap entry.
struct Head {
    record: RunRecord,
    input: usize,
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Head {}
impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Head {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: `BinaryHeap` is a max-heap.
        (other.record.hash, &other.record.key, other.input).cmp(&(
            self.record.hash,
            &self.record.key,
            self.input,
        ))
    }
}

/// Merges `inputs` (newest first) into one run written at `at`: of the records of one
/// key the newest is kept, the others are handed to `superseded` (so that what they
/// reference out of line can be released); into a base (`kind`), a newest record that is
/// a tombstone is dropped too, as nothing older remains for it to hide.
pub(crate) fn merge(
    device: &dyn BlockDevice,
    inputs: &[Arc<Run>],
    at: u64,
    kind: RunKind,
    superseded: &mut dyn FnMut(RunRecord),
) -> Result<Run> {
    let expected = inputs.iter().map(|r| r.records()).sum();
    let mut writer = RunWriter::new(device, at, kind, expected);
    let mut scans: Vec<RunScan<'_>> = inputs.iter().map(|r| r.scan(device)).collect();
    let mut heads = BinaryHeap::with_capacity(scans.len());
    for (input, scan) in scans.iter_mut().enumerate() {
        if let Some(record) = scan.next_record()? {
            heads.push(Head { record, input });
        }
    }
    while let Some(Head { record, input }) = heads.pop() {
        if let Some(next) = scans[input].next_record()? {
            heads.push(Head {
                record: next,
                input,
            });
        }
        // Older versions of the same key come out next.
        while heads
            .peek()
            .is_some_and(|h| h.record.hash == record.hash && h.record.key == record.key)
        {
            let Head {
                record: old,
                input: old_input,
            } = heads.pop().expect("peeked");
            if let Some(next) = scans[old_input].next_record()? {
                heads.push(Head {
                    record: next,
                    input: old_input,
                });
            }
            superseded(old);
        }
        if kind == RunKind::Base && record.value.is_none() {
            continue;
        }
        writer.push(&record)?;
    }
    writer.finish()
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::hash::hot::hash_key;
    use crate::storage::MemBlocks;

    fn record(key: &[u8], value: Option<&[u8]>) -> RunRecord {
        RunRecord {
            hash: hash_key(key).0,
            key: key.to_vec(),
            value: value.map(|v| LogValue::inline(v.to_vec())),
        }
    }

    fn sorted(mut records: Vec<RunRecord>) -> Vec<RunRecord> {
        records.sort_by(|a, b| (a.hash, &a.key).cmp(&(b.hash, &b.key)));
        records
    }

    fn write(device: &dyn BlockDevice, at: u64, kind: RunKind, records: &[RunRecord]) -> Run {
        let mut writer = RunWriter::new(device, at, kind, records.len() as u64);
        for r in records {
            writer.push(r).unwrap();
        }
        writer.finish().unwrap()
    }

    fn key(i: u64) -> Vec<u8> {
        format!("key{i:08}").into_bytes()
    }

    #[test]
    fn a_run_finds_every_key_with_one_read_and_a_quarter_byte_of_fences_per_key() {
        let device = MemBlocks::with_segments(256 << 10);
        let records = sorted(
            (0..20_000)
                .map(|i| record(&key(i), Some(&[i as u8; 100])))
                .collect(),
        );
        let run = write(&device, 8 << 10, RunKind::Base, &records);
        let fence_bytes = run.data_pages() * 8;
        // 8 + 100-byte records, 16-byte headers: 32 to a page.
        assert!(
            fence_bytes * 4 <= records.len() as u64,
            "{fence_bytes} bytes of fences for {} keys",
            records.len()
        );
        let (_, read_before) = device.io_bytes();
        for r in &records {
            let unit = run.locate(r.hash).unwrap();
            assert_eq!(unit.len, PAGE_BYTES, "one page per lookup");
            let found = run.get(&device, r.hash, &r.key).unwrap();
            assert_eq!(found, Some(r.value.clone()), "{:?}", r.key);
        }
        let (_, read_after) = device.io_bytes();
        assert_eq!(
            read_after - read_before,
            (records.len() * PAGE_BYTES) as u64
        );
        for i in 20_000..21_000 {
            let k = key(i);
            assert_eq!(run.get(&device, hash_key(&k).0, &k).unwrap(), None);
        }
        // Reopened from its extent, the run answers the same.
        let (start, end) = run.extent();
        let opened = Run::open(&device, start, end).unwrap();
        assert_eq!(opened.fences, run.fences);
        assert_eq!(opened.kind(), RunKind::Base);
        assert_eq!(opened.records(), 20_000);
        let mut scan = opened.scan(&device);
        for r in &records {
            assert_eq!(scan.next_record().unwrap().as_ref(), Some(r));
        }
        assert_eq!(scan.next_record().unwrap(), None);
    }

    #[test]
    fn long_records_and_one_hashs_records_stay_in_one_unit() {
        let device = MemBlocks::with_segments(64 << 10);
        // Records sharing a hash (forced) and records longer than a page, around
        // ordinary ones; a segment of 16 pages makes units straddle segments.
        let mut records = Vec::new();
        for i in 0..400u64 {
            let k = key(i);
            let mut r = record(&k, Some(&vec![i as u8; (i as usize * 37) % 300]));
            if i % 50 == 0 {
                r.key = vec![b'L'; 5_000 + i as usize];
                r.hash = hash_key(&r.key).0;
            }
            if i % 7 == 0 {
                r.hash = 42 << 40; // one hash, many keys
                r.value = Some(LogValue::inline(vec![7; 900]));
            }
            if i % 11 == 0 {
                r.value = None;
            }
            records.push(r);
        }
        let records = sorted(records);
        let run = write(&device, 0, RunKind::Delta, &records);
        for r in &records {
            assert!(run.may_contain(r.hash));
            let got = run.get(&device, r.hash, &r.key).unwrap();
            assert_eq!(got, Some(r.value.clone()), "{} bytes of key", r.key.len());
        }
        let shared = run.locate(42 << 40).unwrap();
        assert!(shared.len > PAGE_BYTES, "{shared:?}");
        let (start, end) = run.extent();
        let opened = Run::open(&device, start, end).unwrap();
        assert_eq!(opened.kind(), RunKind::Delta);
        let mut scan = opened.scan(&device);
        let mut n = 0;
        while let Some(r) = scan.next_record().unwrap() {
            assert_eq!(r, records[n]);
            n += 1;
        }
        assert_eq!(n, records.len());
    }

    #[test]
    fn gathered_records_are_written_sorted_one_per_key_the_highest_sources() {
        let device = MemBlocks::new();
        let mut gathered = Gathered::default();
        // Keys in reverse order, each twice: the higher source last for even keys,
        // first for odd ones; a few longer than a gathering chunk's page.
        for i in (0..3_000u64).rev() {
            let k = key(i);
            let hash = hash_key(&k).0;
            let long = vec![b'x'; if i % 500 == 0 { 9_000 } else { 20 }];
            let old = LogValue::inline(format!("old {i}").into_bytes());
            let new = LogValue {
                bytes: [format!("new {i}").as_bytes(), &long].concat(),
                out_of_line: i % 3 == 0,
            };
            let (first, second) = match i % 2 {
                0 => ((Some(&old), 10 * i), (Some(&new), 10 * i + 5)),
                _ => ((Some(&new), 10 * i + 5), (Some(&old), 10 * i)),
            };
            gathered.push(hash, &k, first.0, first.1);
            gathered.push(hash, &k, second.0, second.1);
        }
        gathered.push(hash_key(b"gone").0, b"gone", None, 1);
        assert_eq!(gathered.len(), 6_001);
        let (mut runs, written) = gathered
            .write_runs(&device, 0, RunKind::Delta, |_| 0)
            .unwrap();
        let (_, run) = runs.pop().unwrap();
        assert!(runs.is_empty());
        assert_eq!((written, run.records()), (3_001, 3_001));
        let mut scan = run.scan(&device);
        let mut last = None;
        while let Some(r) = scan.next_record().unwrap() {
            assert!(last < Some((r.hash, r.key.clone())), "out of order");
            last = Some((r.hash, r.key.clone()));
            if r.key == b"gone" {
                assert_eq!(r.value, None);
                continue;
            }
            let v = r.value.unwrap();
            assert!(
                v.bytes.starts_with(b"new "),
                "{:?}",
                String::from_utf8_lossy(&r.key)
            );
        }
    }

    #[test]
    fn a_deltas_filter_skips_most_absent_keys() {
        let device = MemBlocks::new();
        let records = sorted((0..10_000).map(|i| record(&key(i), Some(b"v"))).collect());
        let run = write(&device, 0, RunKind::Delta, &records);
        let false_positives = (10_000..110_000)
            .filter(|&i| run.may_contain(hash_key(&key(i)).0))
            .count();
        // 10 bits a key: about 1%.
        assert!(false_positives < 2_000, "{false_positives} of 100,000");
        assert!(records.iter().all(|r| run.may_contain(r.hash)));
    }

    #[test]
    fn runs_without_a_filter_keep_the_first_format_version() {
        // A base's layout did not change with the blocked filters: its footer says
        // version 1, so that builds before them still open it; a delta's says 2.
        let device = MemBlocks::new();
        let records = sorted((0..100).map(|i| record(&key(i), Some(b"v"))).collect());
        let base = write(&device, 0, RunKind::Base, &records);
        let delta = write(&device, base.extent().1, RunKind::Delta, &records);
        for (run, version) in [(&base, 1u32), (&delta, FORMAT_VERSION)] {
            let mut page = AlignedBuf::new(PAGE_BYTES);
            device
                .read(run.extent().1 - PAGE_BYTES as u64, page.as_mut())
                .unwrap();
            assert_eq!(le_u32(page.as_ref(), 8), version);
            let reopened = Run::open(&device, run.extent().0, run.extent().1).unwrap();
            assert!(records.iter().all(|r| reopened.may_contain(r.hash)));
        }
    }

    #[test]
    fn both_filter_layouts_keep_every_key_and_few_others_within_one_partition() {
        // Hashes of one partition of 64 (their top six bits alike), as one run holds:
        // the blocked layout must not pick its blocks from those bits.
        let hash = |i: u64| (hash_key(&key(i)).0 >> 6) | (37 << 58);
        for version in [1, 2] {
            let mut filter = Filter::of_version(Filter::with_keys(10_000).words, version);
            for i in 0..10_000 {
                filter.insert(hash(i));
            }
            assert!((0..10_000).all(|i| filter.may_contain(hash(i))));
            let false_positives = (10_000..110_000)
                .filter(|&i| filter.may_contain(hash(i)))
                .count();
            assert!(
                false_positives < 2_000,
                "version {version}: {false_positives} of 100,000"
            );
        }
    }

    /// Merges of deltas into a base, checked against a map at every step: the newest
    /// version of each key wins, a base keeps no tombstone, and every version that lost
    /// is handed back exactly once.
    #[test]
    fn merged_runs_answer_as_a_map_of_the_newest_versions() {
        let device = MemBlocks::with_segments(128 << 10);
        let mut model: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
        let mut runs: Vec<Arc<Run>> = Vec::new(); // newest first
        let mut tail = 0u64;
        let mut rng = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut versions_written = 0u64;
        let mut versions_superseded = 0u64;
        for round in 0..12u64 {
            let mut delta: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
            for _ in 0..1_500 {
                let k = key(next() % 4_000);
                let v =
                    (next() % 5 != 0).then(|| format!("{round}-{}", next() % 1000).into_bytes());
                delta.insert(k, v);
            }
            let records = sorted(delta.iter().map(|(k, v)| record(k, v.as_deref())).collect());
            versions_written += records.len() as u64;
            let run = write(&device, tail, RunKind::Delta, &records);
            tail = run.extent().1;
            runs.insert(0, Arc::new(run));
            model.extend(delta);
            if round % 4 == 3 {
                let mut dropped = Vec::new();
                let base = merge(&device, &runs, tail, RunKind::Base, &mut |r| {
                    dropped.push(r)
                })
                .unwrap();
                versions_superseded += dropped.len() as u64;
                // Every superseded version is an older one of a key a newer run holds.
                for d in &dropped {
                    assert!(model.contains_key(&d.key));
                }
                tail = base.extent().1;
                device.truncate_before(base.extent().0).unwrap();
                runs = vec![Arc::new(base)];
                let live = model.values().filter(|v| v.is_some()).count() as u64;
                assert_eq!(runs[0].records(), live, "round {round}");
            }
            for i in 0..4_000 {
                let k = key(i);
                let hash = hash_key(&k).0;
                let mut got = None;
                for run in &runs {
                    if let Some(found) = run.get(&device, hash, &k).unwrap() {
                        got = Some(found);
                        break;
                    }
                }
                let got = got.flatten().map(LogValue::into_bytes);
                let want = model.get(&k).cloned().flatten();
                assert_eq!(got, want, "round {round}, key {i}");
            }
        }
        // Versions written = versions kept (or dropped tombstones) + versions superseded.
        let live = model.values().filter(|v| v.is_some()).count() as u64;
        assert!(versions_superseded > 0 && versions_written >= live + versions_superseded);
    }

    #[test]
    fn damaged_run_bytes_are_refused_never_answered() {
        let device = MemBlocks::new();
        let records = sorted(
            (0..2_000)
                .map(|i| record(&key(i), Some(b"value")))
                .collect(),
        );
        let run = write(&device, 0, RunKind::Delta, &records);
        let (start, end) = run.extent();
        // A flipped bit in a data page: lookups there fail, others answer.
        let mut page = AlignedBuf::new(PAGE_BYTES);
        device.read(PAGE_BYTES as u64, page.as_mut()).unwrap();
        page.as_mut()[100] ^= 1;
        device.write(PAGE_BYTES as u64, page.as_ref()).unwrap();
        let mut refused = 0;
        for r in &records {
            match run.get(&device, r.hash, &r.key) {
                Ok(found) => assert_eq!(found, Some(r.value.clone())),
                Err(e) => {
                    assert!(e.to_string().contains("checksum"), "{e}");
                    refused += 1;
                }
            }
        }
        assert!(refused > 0);
        let mut scan = run.scan(&device);
        let failed = loop {
            match scan.next_record() {
                Ok(Some(_)) => continue,
                Ok(None) => break false,
                Err(_) => break true,
            }
        };
        assert!(failed, "a scan through the damaged page must fail");
        // A damaged footer, or a wrong extent, does not open.
        let mut footer = AlignedBuf::new(PAGE_BYTES);
        device
            .read(end - PAGE_BYTES as u64, footer.as_mut())
            .unwrap();
        footer.as_mut()[20] ^= 4;
        device
            .write(end - PAGE_BYTES as u64, footer.as_ref())
            .unwrap();
        assert!(Run::open(&device, start, end).is_err());
        footer.as_mut()[20] ^= 4;
        device
            .write(end - PAGE_BYTES as u64, footer.as_ref())
            .unwrap();
        assert!(Run::open(&device, start, end).is_ok());
        assert!(Run::open(&device, start, end + PAGE_BYTES as u64).is_err());
        assert!(Run::open(&device, start + PAGE_BYTES as u64, end).is_err());
    }
}
