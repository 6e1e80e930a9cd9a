//! The record layout of a hybrid log (hot log, cold log, read cache).
//!
//! ```text
//!  0..8    header (u64, read and written atomically while the record is in memory)
//!            bits  0..48  previous address in the record's hash chain (0: none)
//!            bit   48     invalid: the record is not part of any chain (a failed insert)
//!            bit   49     tombstone: the key is deleted
//!            bit   50     locked: an in-place update is writing the value
//!            bit   51     1 in every record (so that no header word is zero)
//!            bits 52..64  version: bumped by every in-place update (12 bits, wrapping)
//!  8..10   key length (u16 LE)
//! 10..12   flags (u16 LE): bit 0 out of line (the value is a 16-byte reference to the
//!          database's value store); the other bits 0
//! 12..16   value length (u32 LE)
//! 16..     key, zero-padded to a multiple of 8; then the value
//!  ..+4    on disk: CRC-32C of the record's bytes from its header to the value's end
//!          (the header with `locked` clear); in memory: 0. Then zeros to a multiple of 8
//! ```
//!
//! **The checksum** is per record, because a record is the unit read back: a point
//! read, a batch's read or a compaction's read-ahead reads the sectors holding one
//! record, not its page (pages are up to 4 MiB), and must still tell damage from data
//! in that one read. It is computed when a page is written to its device
//! ([`stamp_checksums`], on the flush's copy of the frame, when no record of the page
//! changes any more) and checked by every decode of bytes read from a device
//! ([`DiskRecord::decode`]). It sits in the value's padding when there are four bytes of
//! it, so it costs a record 0 bytes when the value's length is 1-4 past a multiple of 8
//! (an 8-byte key and a 100-byte value: 128 bytes either way), 8 otherwise.
//!
//! A record never crosses a page of its log, and its size is a multiple of 8, so every
//! record and every value starts 8-byte aligned. A header word of zero is never a
//! record: it marks the unused end of a page (the allocator skips to the next page).
//!
//! **In-place updates** (FASTER §6: a record at or above the read-only address may be
//! updated where it is) replace the value with one of the same length: the lengths and
//! the key never change after the record is published. The header's lock bit and
//! version make the value a seqlock: a writer sets the lock bit with a compare-and-swap,
//! stores the value, and clears the bit while bumping the version; a reader copies the
//! value between two loads of the header and retries if they differ or the bit was set.
//! The value's words are read and written as atomics, so racing copies are torn (and
//! retried) but never undefined.
//!
//! **Values out of line.** A value longer than the database's inline limit lives in the
//! value store (`storage/values.rs`) and its record holds the 16-byte reference, with the
//! out-of-line flag set. The flag lives in bytes that every record of the earlier
//! builds has zero, so their records read as what they are: inline. A record's flag
//! never changes once it is published, and an in-place update never replaces an
//! out-of-line value (see `hot.rs`): a reference leaves the log only with its record.
//!
//! Decoding a record read from disk checks every length against the bytes read: a
//! corrupt record is an error, never a panic.

// Words inside page frames are raw memory: `std` atomics over it, as the pool's block
// headers are (shuttle's atomics cannot live there; see `crate::sync`).
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes before the key.
pub(crate) const RECORD_HEADER_BYTES: usize = 16;
/// Bytes of the checksum after the value.
const CHECKSUM_BYTES: usize = 4;

const ADDRESS_MASK: u64 = (1 << 48) - 1;
const INVALID: u64 = 1 << 48;
const TOMBSTONE: u64 = 1 << 49;
const LOCKED: u64 = 1 << 50;
const PRESENT: u64 = 1 << 51;
const VERSION_SHIFT: u32 = 52;

/// The lengths word's bit saying the value is out of line (bit 0 of bytes 10..12).
const OUT_OF_LINE: u64 = 1 << 16;
/// The lengths word's bits that must be zero (the rest of bytes 10..12).
const RESERVED: u64 = 0xffff_0000 & !OUT_OF_LINE;

/// The largest key a record holds.
pub(crate) const MAX_KEY_BYTES: usize = u16::MAX as usize;

fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// The bytes a record of this key and value takes in its log.
pub(crate) fn record_size_bytes(key_len: usize, value_len: usize) -> usize {
    RECORD_HEADER_BYTES + pad8(key_len) + pad8(value_len + CHECKSUM_BYTES)
}

/// Bytes of a record the checksum covers: up to the value's end.
fn checked_bytes(key_len: usize, value_len: usize) -> usize {
    RECORD_HEADER_BYTES + pad8(key_len) + value_len
}

fn le_u64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// Writes the checksum of every record of a page copy about to be written to its
/// device: the records from `first` (the page's first record) up to its zero end or
/// `until`, whichever comes first. The `locked` bit is cleared in the copy (an on-disk
/// record is never locked). Bytes from where the records end are zeroed, so that the
/// device never holds the start of a record being written past `until` (the tail of a
/// checkpoint's partial page).
pub(crate) fn stamp_checksums(page: &mut [u8], first: usize, until: usize) {
    let until = until.min(page.len());
    let mut at = first;
    while let (Some(word), Some(lengths)) = (le_u64(page, at), le_u64(page, at + 8)) {
        let (k, v) = ((lengths & 0xffff) as usize, (lengths >> 32) as usize);
        let size = record_size_bytes(k, v);
        if word & PRESENT == 0 || at + size > until {
            break;
        }
        page[at..at + 8].copy_from_slice(&(word & !LOCKED).to_le_bytes());
        let end = at + checked_bytes(k, v);
        let crc = crc32c::crc32c(&page[at..end]);
        page[end..end + CHECKSUM_BYTES].copy_from_slice(&crc.to_le_bytes());
        at += size;
    }
    if let Some(rest) = page.get_mut(at.max(first)..) {
        rest.fill(0);
    }
}

/// A record's header word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header(pub(crate) u64);

impl Header {
    pub(crate) fn new(previous: u64, tombstone: bool) -> Header {
        assert!(
            previous <= ADDRESS_MASK,
            "address {previous} exceeds 48 bits"
        );
        Header(previous | PRESENT | if tombstone { TOMBSTONE } else { 0 })
    }

    pub(crate) fn previous(self) -> u64 {
        self.0 & ADDRESS_MASK
    }

    pub(crate) fn is_invalid(self) -> bool {
        self.0 & INVALID != 0
    }

    pub(crate) fn is_tombstone(self) -> bool {
        self.0 & TOMBSTONE != 0
    }

    fn is_locked(self) -> bool {
        self.0 & LOCKED != 0
    }

    fn bumped(self) -> Header {
        let version = (self.0 >> VERSION_SHIFT).wrapping_add(1) << VERSION_SHIFT;
        Header((self.0 & ((1 << VERSION_SHIFT) - 1) & !LOCKED) | version)
    }
}

/// A record in a page frame: a view of its bytes by raw pointer.
///
/// The frame's page must stay in memory while the view is used: the caller is protected
/// by the log's epoch and checked that the address is at or above the head address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MemRecord {
    ptr: *mut u8,
}

impl MemRecord {
    /// # Safety
    ///
    /// `ptr` points at a published record (or at space being filled by its allocator,
    /// for [`MemRecord::init`]) in a page frame that stays allocated while the view is
    /// used, 8-byte aligned.
    pub(crate) unsafe fn at(ptr: *mut u8) -> MemRecord {
        debug_assert!((ptr as usize).is_multiple_of(8));
        MemRecord { ptr }
    }

    fn header_word(&self) -> &AtomicU64 {
        // SAFETY: 8-byte aligned and inside the frame (`at`'s contract); header words
        // are only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.ptr.cast::<u64>()) }
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8));
        // SAFETY: as `header_word`: the offset is inside the record, whose words past the
        // header are accessed only as atomics once it is published.
        unsafe { AtomicU64::from_ptr(self.ptr.add(offset).cast::<u64>()) }
    }

    /// Writes a new record into space the caller allocated (and nobody else sees yet):
    /// lengths, key and value; the header last, with release ordering, so a reader that
    /// sees the header sees the rest.
    pub(crate) fn init(&self, header: Header, key: &[u8], value: &[u8]) {
        self.init_value(header, key, value, false);
    }

    /// [`MemRecord::init`] of a value that is out of line (`value` is its reference) if
    /// `out_of_line`.
    pub(crate) fn init_value(&self, header: Header, key: &[u8], value: &[u8], out_of_line: bool) {
        assert!(key.len() <= MAX_KEY_BYTES);
        let flags = if out_of_line { OUT_OF_LINE } else { 0 };
        let lengths = (key.len() as u64) | flags | ((value.len() as u64) << 32);
        self.word(8).store(lengths, Ordering::Relaxed);
        store_bytes(self, RECORD_HEADER_BYTES, key);
        store_bytes(self, RECORD_HEADER_BYTES + pad8(key.len()), value);
        self.header_word().store(header.0, Ordering::Release);
    }

    pub(crate) fn header(&self) -> Header {
        Header(self.header_word().load(Ordering::Acquire))
    }

    fn lengths(&self) -> (usize, usize) {
        let w = self.word(8).load(Ordering::Relaxed);
        ((w & 0xffff) as usize, (w >> 32) as usize)
    }

    /// Whether the record's value is out of line (its bytes are the reference).
    pub(crate) fn is_out_of_line(&self) -> bool {
        self.word(8).load(Ordering::Relaxed) & OUT_OF_LINE != 0
    }

    /// The record's size in its log.
    pub(crate) fn size_bytes(&self) -> usize {
        let (k, v) = self.lengths();
        record_size_bytes(k, v)
    }

    /// Whether the record's key is `key`: compared a word at a time, nothing copied.
    pub(crate) fn key_equals(&self, key: &[u8]) -> bool {
        let (k, _) = self.lengths();
        k == key.len()
            && key.chunks(8).enumerate().all(|(i, chunk)| {
                let word = self
                    .word(RECORD_HEADER_BYTES + i * 8)
                    .load(Ordering::Relaxed);
                word.to_le_bytes()[..chunk.len()] == *chunk
            })
    }

    pub(crate) fn key(&self) -> Vec<u8> {
        let (k, _) = self.lengths();
        load_bytes(self, RECORD_HEADER_BYTES, k)
    }

    /// A consistent copy of the header and value (retrying while an in-place update
    /// runs).
    pub(crate) fn read_value(&self) -> (Header, Vec<u8>) {
        let (k, v) = self.lengths();
        let mut spins = 0u32;
        loop {
            let before = self.header();
            if !before.is_locked() {
                let value = load_bytes(self, RECORD_HEADER_BYTES + pad8(k), v);
                if self.header_word().load(Ordering::Acquire) == before.0 {
                    return (before, value);
                }
            }
            spins += 1;
            crate::sync::spin_wait(spins);
        }
    }

    /// [`MemRecord::read_value`] with the value as the record holds it (`None` for a
    /// tombstone).
    pub(crate) fn read_log_value(&self) -> (Header, Option<LogValue>) {
        let (header, bytes) = self.read_value();
        let value = (!header.is_tombstone()).then(|| LogValue {
            bytes,
            out_of_line: self.is_out_of_line(),
        });
        (header, value)
    }

    /// Replaces the value in place with `value` (inline) of the same length; false
    /// (nothing written) if the length differs, the record's value is out of line, or
    /// the record is a tombstone or invalid. (An out-of-line value is never replaced in
    /// place: its reference leaves the log only with its record, which compaction
    /// reports; see `hot.rs`.)
    pub(crate) fn update_in_place(&self, value: &[u8]) -> bool {
        if self.lengths().1 != value.len() || self.is_out_of_line() {
            return false;
        }
        let Some(mut locked) = self.lock() else {
            return false;
        };
        if locked.header().is_tombstone() {
            return false;
        }
        locked.write_value(value);
        true
    }

    /// Takes the record's lock (waiting while another writer holds it), for a
    /// read-modify-write; `None` if the record is invalid (sealed or never linked).
    pub(crate) fn lock(&self) -> Option<LockedRecord> {
        let word = self.header_word();
        let mut spins = 0u32;
        loop {
            let current = Header(word.load(Ordering::Acquire));
            if current.is_invalid() {
                return None;
            }
            if !current.is_locked()
                && word
                    .compare_exchange(
                        current.0,
                        current.0 | LOCKED,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                return Some(LockedRecord {
                    record: *self,
                    header: current,
                    written: false,
                });
            }
            spins += 1;
            crate::sync::spin_wait(spins);
        }
    }

    /// Sets the invalid bit (a record whose index insert failed).
    pub(crate) fn invalidate(&self) {
        self.header_word().fetch_or(INVALID, Ordering::AcqRel);
    }
}

/// A record whose lock this thread holds: its value may be read and replaced without
/// racing another writer. Dropping it unlocks (bumping the version if it wrote).
pub(crate) struct LockedRecord {
    record: MemRecord,
    /// The header before locking.
    header: Header,
    written: bool,
}

impl LockedRecord {
    pub(crate) fn header(&self) -> Header {
        self.header
    }

    /// Whether the record's value is out of line (its bytes are the reference).
    pub(crate) fn is_out_of_line(&self) -> bool {
        self.record.is_out_of_line()
    }

    pub(crate) fn value(&self) -> Vec<u8> {
        let (k, v) = self.record.lengths();
        load_bytes(&self.record, RECORD_HEADER_BYTES + pad8(k), v)
    }

    /// Replaces the value with one of the same length.
    pub(crate) fn write_value(&mut self, value: &[u8]) {
        let (k, v) = self.record.lengths();
        assert_eq!(v, value.len(), "an in-place write changes no length");
        store_bytes(&self.record, RECORD_HEADER_BYTES + pad8(k), value);
        self.written = true;
    }

    /// Marks the record invalid and unlocks it: a newer copy replaced it in its chain,
    /// and writers that wait for the lock must go to that copy.
    pub(crate) fn seal(self) {
        self.record
            .header_word()
            .store((self.header.0 | INVALID) & !LOCKED, Ordering::Release);
        std::mem::forget(self);
    }
}

impl Drop for LockedRecord {
    fn drop(&mut self) {
        let unlocked = if self.written {
            self.header.bumped()
        } else {
            self.header
        };
        self.record
            .header_word()
            .store(unlocked.0, Ordering::Release);
    }
}

/// Stores `bytes` at `offset` (8-aligned) as whole atomic words, zero-padding the last.
fn store_bytes(record: &MemRecord, offset: usize, bytes: &[u8]) {
    for (i, chunk) in bytes.chunks(8).enumerate() {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        record
            .word(offset + i * 8)
            .store(u64::from_le_bytes(word), Ordering::Relaxed);
    }
}

/// Loads `len` bytes at `offset` (8-aligned) as whole atomic words.
fn load_bytes(record: &MemRecord, offset: usize, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(pad8(len));
    for i in 0..pad8(len) / 8 {
        let word = record.word(offset + i * 8).load(Ordering::Relaxed);
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A record decoded from bytes read from disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DiskRecord {
    pub(crate) header: Header,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Vec<u8>,
    /// Whether `value` is the reference of a value kept out of line.
    pub(crate) out_of_line: bool,
}

impl DiskRecord {
    /// The record's value as it holds it (`None` for a tombstone).
    pub(crate) fn log_value(&self) -> Option<LogValue> {
        (!self.header.is_tombstone()).then(|| LogValue {
            bytes: self.value.clone(),
            out_of_line: self.out_of_line,
        })
    }
}

/// A value as a record holds it: its bytes, or (`out_of_line`) the 16-byte reference
/// of a value the database's value store keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LogValue {
    pub(crate) bytes: Vec<u8>,
    pub(crate) out_of_line: bool,
}

impl LogValue {
    /// An inline value.
    pub(crate) fn inline(bytes: Vec<u8>) -> LogValue {
        LogValue {
            bytes,
            out_of_line: false,
        }
    }

    /// The bytes of an inline value; for an out-of-line one, its reference.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// Why bytes read from disk are not a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decode {
    /// The record continues past the bytes read: read this many bytes from its start.
    NeedBytes(usize),
    /// The bytes are not a record.
    Corrupt(String),
}

impl DiskRecord {
    /// Decodes the record at the start of `bytes`, read from a device, checking its
    /// checksum. `bytes` must extend to the end of its page or further (`page_room` is
    /// how many bytes of the page are left from the record's start).
    pub(crate) fn decode(bytes: &[u8], page_room: usize) -> Result<DiskRecord, Decode> {
        Self::decode_checked(bytes, page_room, true)
    }

    /// [`DiskRecord::decode`] of bytes copied from a page frame in memory, whose
    /// records carry no checksum.
    pub(crate) fn decode_in_memory(bytes: &[u8], page_room: usize) -> Result<DiskRecord, Decode> {
        Self::decode_checked(bytes, page_room, false)
    }

    fn decode_checked(bytes: &[u8], page_room: usize, check: bool) -> Result<DiskRecord, Decode> {
        let Some(fixed) = bytes.get(..RECORD_HEADER_BYTES) else {
            return Err(Decode::NeedBytes(RECORD_HEADER_BYTES));
        };
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&fixed[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let header = Header(word(0));
        if header.0 & PRESENT == 0 {
            return Err(Decode::Corrupt("no record at this address".into()));
        }
        let lengths = word(8);
        let (k, v) = ((lengths & 0xffff) as usize, (lengths >> 32) as usize);
        if lengths & RESERVED != 0 {
            return Err(Decode::Corrupt(format!("reserved bits set: {lengths:#x}")));
        }
        let size = record_size_bytes(k, v);
        if size > page_room {
            return Err(Decode::Corrupt(format!(
                "a record of {size} bytes where its page has {page_room} left"
            )));
        }
        let Some(body) = bytes.get(RECORD_HEADER_BYTES..size) else {
            return Err(Decode::NeedBytes(size));
        };
        let value_at = pad8(k);
        if check {
            let end = checked_bytes(k, v);
            let (covered, stored) = (&bytes[..end], &bytes[end..end + CHECKSUM_BYTES]);
            let mut word = [0u8; CHECKSUM_BYTES];
            word.copy_from_slice(stored);
            let stored = u32::from_le_bytes(word);
            let computed = crc32c::crc32c(covered);
            if stored != computed {
                return Err(Decode::Corrupt(format!(
                    "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
                )));
            }
        }
        Ok(DiskRecord {
            header: Header(header.0 & !LOCKED),
            key: body[..k].to_vec(),
            value: body[value_at..value_at + v].to_vec(),
            out_of_line: lengths & OUT_OF_LINE != 0,
        })
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    #[repr(align(8))]
    struct Buf([u8; 256]);

    #[test]
    fn a_record_written_in_memory_decodes_from_its_bytes() {
        let mut buf = Buf([0; 256]);
        // SAFETY: the buffer is 8-aligned, large enough, and only this test uses it.
        let rec = unsafe { MemRecord::at(buf.0.as_mut_ptr()) };
        rec.init(
            Header::new(12_345, false),
            b"key-1",
            b"a value of 21 bytes..",
        );
        // 21 bytes of value and 4 of checksum: padded to 32.
        assert_eq!(rec.size_bytes(), 16 + 8 + 32);
        assert!(rec.key_equals(b"key-1") && !rec.key_equals(b"key-2"));
        assert!(rec.update_in_place(b"another value, 21 b.."));
        assert!(!rec.update_in_place(b"short"), "lengths must match");
        let (h, v) = rec.read_value();
        assert_eq!(v, b"another value, 21 b..");
        assert_eq!(h.previous(), 12_345);
        // In memory a record has no checksum; the flush's copy gets one.
        assert!(DiskRecord::decode(&buf.0, 256).is_err());
        assert_eq!(
            DiskRecord::decode_in_memory(&buf.0, 256).unwrap().value,
            b"another value, 21 b.."
        );
        stamp_checksums(&mut buf.0, 0, 256);
        let d = DiskRecord::decode(&buf.0, 256).unwrap();
        assert_eq!(d.key, b"key-1");
        assert_eq!(d.value, b"another value, 21 b..");
        assert_eq!(d.header.previous(), 12_345);
        assert!(!d.header.is_tombstone());
        // Every truncation asks for more or is corrupt; never a panic.
        for cut in 0..48 {
            assert!(DiskRecord::decode(&buf.0[..cut], 256).is_err());
        }
        assert!(matches!(
            DiskRecord::decode(&buf.0, 40),
            Err(Decode::Corrupt(_))
        ));
        // An invalid record refuses in-place updates and says so on disk too.
        rec.invalidate();
        assert!(!rec.update_in_place(b"a third value of 21 b"));
        stamp_checksums(&mut buf.0, 0, 256);
        assert!(DiskRecord::decode(&buf.0, 256).unwrap().header.is_invalid());
    }

    #[test]
    fn the_out_of_line_flag_survives_memory_and_disk_and_other_reserved_bits_are_corrupt() {
        let mut buf = Buf([0; 256]);
        // SAFETY: the buffer is 8-aligned, large enough, and only this test uses it.
        let rec = unsafe { MemRecord::at(buf.0.as_mut_ptr()) };
        let reference = [9u8; 16];
        rec.init_value(Header::new(64, false), b"key", &reference, true);
        assert!(rec.is_out_of_line());
        assert_eq!(
            rec.read_log_value().1,
            Some(LogValue {
                bytes: reference.to_vec(),
                out_of_line: true
            })
        );
        // Never replaced in place, even by a value of its length.
        assert!(!rec.update_in_place(&[1u8; 16]));
        stamp_checksums(&mut buf.0, 0, 256);
        let d = DiskRecord::decode(&buf.0, 256).unwrap();
        assert!(d.out_of_line);
        assert_eq!(d.value, reference);
        // A record of an earlier build (bytes 10..12 zero) is inline.
        let mut old = Buf([0; 256]);
        // SAFETY: as above.
        let rec = unsafe { MemRecord::at(old.0.as_mut_ptr()) };
        rec.init(Header::new(64, false), b"key", &reference);
        stamp_checksums(&mut old.0, 0, 256);
        assert!(!DiskRecord::decode(&old.0, 256).unwrap().out_of_line);
        // Any other bit of bytes 10..12 is damage, with a valid checksum too.
        for bit in 1..16 {
            let mut bytes = buf.0;
            bytes[10 + bit / 8] |= 1 << (bit % 8);
            let end = checked_bytes(3, 16);
            let crc = crc32c::crc32c(&bytes[..end]);
            bytes[end..end + 4].copy_from_slice(&crc.to_le_bytes());
            assert!(
                matches!(DiskRecord::decode(&bytes, 256), Err(Decode::Corrupt(_))),
                "bit {bit}"
            );
        }
    }

    #[test]
    fn every_flipped_bit_of_a_record_on_disk_is_corrupt_never_another_record() {
        let mut buf = Buf([0; 256]);
        for (at, key, value) in [(0, &b"k1"[..], &[7u8; 100][..]), (128, b"key-2", b"v")] {
            // SAFETY: the buffer is 8-aligned, large enough, and only this test uses it.
            let rec = unsafe { MemRecord::at(buf.0.as_mut_ptr().add(at)) };
            rec.init(Header::new(40, false), key, value);
        }
        // An 8-byte key and a 100-byte value keep the 128 bytes they took unchecked.
        assert_eq!(record_size_bytes(8, 100), 128);
        // A page copy ending after the first record: the second is zeroed, not stamped.
        let mut page = buf.0;
        stamp_checksums(&mut page, 0, 128);
        assert!(page[128..].iter().all(|&b| b == 0));
        stamp_checksums(&mut buf.0, 0, 256);
        for at in [0, 128] {
            let good = DiskRecord::decode(&buf.0[at..], 256 - at).unwrap();
            let size = record_size_bytes(good.key.len(), good.value.len());
            for bit in 0..size * 8 {
                let mut bytes = buf.0;
                bytes[at + bit / 8] ^= 1 << (bit % 8);
                // A flip the decode lets through must not change the record: only the
                // padding after the checksum is not read.
                if let Ok(d) = DiskRecord::decode(&bytes[at..], 256 - at) {
                    assert_eq!(d, good, "bit {bit} of the record at {at}");
                }
            }
        }
    }

    #[test]
    fn concurrent_in_place_updates_are_never_read_torn() {
        let mut buf = Buf([0; 256]);
        let ptr = buf.0.as_mut_ptr() as usize;
        // SAFETY: as above; the threads below are scoped to the buffer's life.
        let rec = unsafe { MemRecord::at(ptr as *mut u8) };
        rec.init(Header::new(0, false), b"k", &[0u8; 96]);
        std::thread::scope(|s| {
            for t in 1..=2u8 {
                s.spawn(move || {
                    // SAFETY: as above.
                    let rec = unsafe { MemRecord::at(ptr as *mut u8) };
                    for _ in 0..20_000 {
                        assert!(rec.update_in_place(&[t; 96]));
                    }
                });
            }
            s.spawn(move || {
                // SAFETY: as above.
                let rec = unsafe { MemRecord::at(ptr as *mut u8) };
                for _ in 0..20_000 {
                    let (_, v) = rec.read_value();
                    assert!(v.iter().all(|&b| b == v[0]), "a torn value: {v:?}");
                }
            });
        });
    }
}
