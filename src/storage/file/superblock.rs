//! The superblock of a file store: its layout, encoding, decoding, validation, and the
//! choice between its two copies.
//!
//! Superblock payload (after the 16-byte page header of kind 2), little-endian:
//!
//! ```text
//! 0..8    magic b"BFDBFILE"
//! 8..10   format version (u16)
//! 10..12  reserved, zero
//! 12..16  page size in bytes (u32)
//! 16..24  generation (u64); slot = generation % 2
//! 24..32  high-water mark: number of slots the durable state covers (u64)
//! 32..40  first page of the free-list chain, 0 if none (u64)
//! 40..48  number of free page numbers the chain lists (u64)
//! 48..56  number of pages in the chain (u64)
//! ```
//!
//! # Invariants this module owns
//!
//! - Generation `g` lives in slot `g % 2`, so consecutive syncs write alternate copies
//!   and a torn write can only damage the copy that is not current.
//! - A copy is trusted only if its checksum holds, it carries this build's format
//!   version and page size, its page kind is superblock, and its fields are consistent
//!   with each other ([`Superblock::validate`]). Of the trusted copies the newest
//!   generation wins; a copy of another format refuses the whole file.
//! - Decoding accepts any bytes: every field is read through checked access, so bytes
//!   from disk never reach an unchecked index or an `unwrap`.

#![deny(clippy::indexing_slicing)]

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use super::super::{
    FORMAT_VERSION, PAGE_PAYLOAD_SIZE, PAGE_SIZE, Page, PageKind, PageNo, corrupt_page,
    incompatible_file,
};
use super::freelist::{ChainRecord, FREE_LIST_ENTRIES_PER_PAGE};
use super::{FIRST_DATA_SLOT, le_u16, le_u32, le_u64, offset_of};

/// The magic bytes that open every superblock payload.
const MAGIC: [u8; 8] = *b"BFDBFILE";

// Superblock payload offsets.
const SB_MAGIC: Range<usize> = 0..8;
const SB_VERSION: Range<usize> = 8..10;
const SB_RESERVED: Range<usize> = 10..12;
const SB_PAGE_SIZE: Range<usize> = 12..16;
const SB_GENERATION: Range<usize> = 16..24;
const SB_HIGH_WATER: Range<usize> = 24..32;
const SB_FREE_HEAD: Range<usize> = 32..40;
const SB_FREE_COUNT: Range<usize> = 40..48;
const SB_FREE_LIST_PAGES: Range<usize> = 48..56;
const SUPERBLOCK_SIZE_BYTES: usize = 56;

const _: () = assert!(SB_MAGIC.end == SB_VERSION.start);
const _: () = assert!(SB_VERSION.end == SB_RESERVED.start);
const _: () = assert!(SB_RESERVED.end == SB_PAGE_SIZE.start);
const _: () = assert!(SB_PAGE_SIZE.end == SB_GENERATION.start);
const _: () = assert!(SB_GENERATION.end == SB_HIGH_WATER.start);
const _: () = assert!(SB_HIGH_WATER.end == SB_FREE_HEAD.start);
const _: () = assert!(SB_FREE_HEAD.end == SB_FREE_COUNT.start);
const _: () = assert!(SB_FREE_COUNT.end == SB_FREE_LIST_PAGES.start);
const _: () = assert!(SB_FREE_LIST_PAGES.end == SUPERBLOCK_SIZE_BYTES);
const _: () = assert!(SUPERBLOCK_SIZE_BYTES <= PAGE_PAYLOAD_SIZE);

/// The decoded fields of a superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Superblock {
    pub(super) generation: u64,
    pub(super) high_water: u64,
    pub(super) free_head: u64,
    pub(super) free_count: u64,
    pub(super) free_list_pages: u64,
}

impl Superblock {
    /// The superblock of an empty store at `generation`.
    pub(super) fn empty(generation: u64) -> Superblock {
        Superblock {
            generation,
            high_water: FIRST_DATA_SLOT,
            free_head: 0,
            free_count: 0,
            free_list_pages: 0,
        }
    }

    /// The slot this superblock is written to.
    pub(super) fn slot(&self) -> u64 {
        self.generation % 2
    }

    /// What the superblock records of the free-list chain, for loading it.
    pub(super) fn chain(&self) -> ChainRecord {
        ChainRecord {
            generation: self.generation,
            high_water: self.high_water,
            head: self.free_head,
            pages: self.free_list_pages,
            entries: self.free_count,
        }
    }

    /// Encodes the superblock into a fresh page and stamps its header.
    #[expect(
        clippy::indexing_slicing,
        reason = "constant field ranges that end within the payload (the const asserts above)"
    )]
    pub(super) fn to_page(self) -> Box<Page> {
        let mut page = Page::boxed();
        let p = page.payload_mut();
        p[SB_MAGIC].copy_from_slice(&MAGIC);
        p[SB_VERSION].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        p[SB_PAGE_SIZE].copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
        p[SB_GENERATION].copy_from_slice(&self.generation.to_le_bytes());
        p[SB_HIGH_WATER].copy_from_slice(&self.high_water.to_le_bytes());
        p[SB_FREE_HEAD].copy_from_slice(&self.free_head.to_le_bytes());
        p[SB_FREE_COUNT].copy_from_slice(&self.free_count.to_le_bytes());
        p[SB_FREE_LIST_PAGES].copy_from_slice(&self.free_list_pages.to_le_bytes());
        // The lsn of store-internal pages carries the generation, which helps whoever
        // inspects a file by hand.
        page.set_lsn(self.generation);
        page.stamp(PageKind::Superblock);
        page
    }

    /// Checks the fields for consistency with each other; `slot` is where the copy was
    /// read. Returns the reason if they are inconsistent.
    pub(super) fn validate(&self, slot: u64) -> Result<(), String> {
        let data_slots = self.high_water.checked_sub(FIRST_DATA_SLOT);
        let Some(data_slots) = data_slots else {
            return Err(format!("high-water mark {} is below 2", self.high_water));
        };
        if self.generation % 2 != slot {
            return Err(format!(
                "generation {} does not belong in slot {slot}",
                self.generation
            ));
        }
        if (self.free_head == 0) != (self.free_list_pages == 0) {
            return Err(format!(
                "free-list head {} disagrees with free-list page count {}",
                self.free_head, self.free_list_pages
            ));
        }
        if self.free_head != 0 && !(FIRST_DATA_SLOT..self.high_water).contains(&self.free_head) {
            return Err(format!(
                "free-list head {} lies outside the data slots 2..{}",
                self.free_head, self.high_water
            ));
        }
        let accounted = self.free_count.checked_add(self.free_list_pages);
        if accounted.is_none_or(|n| n > data_slots) {
            return Err(format!(
                "{} free slots and {} free-list pages exceed the {data_slots} data slots",
                self.free_count, self.free_list_pages
            ));
        }
        if self.free_count
            > self
                .free_list_pages
                .saturating_mul(FREE_LIST_ENTRIES_PER_PAGE as u64)
        {
            return Err(format!(
                "{} free slots cannot fit in {} free-list pages",
                self.free_count, self.free_list_pages
            ));
        }
        Ok(())
    }
}

/// What one superblock slot turned out to hold.
#[derive(Debug)]
enum SuperblockCopy {
    /// A checksum-valid, consistent superblock of this format version.
    Valid(Superblock),
    /// It carries the magic but fails its checksum or its consistency checks.
    Corrupt(String),
    /// It does not carry the magic: not a bfdb superblock at all.
    Foreign,
    /// A checksum-valid bfdb superblock of another version or page size.
    OtherFormat(String),
}

/// Whether `payload` opens with the superblock magic.
fn has_magic(payload: &[u8]) -> bool {
    payload.get(SB_MAGIC) == Some(&MAGIC[..])
}

/// Classifies the superblock copy read from `slot`.
fn classify_superblock(page: &Page, slot: u64) -> SuperblockCopy {
    let p = page.payload();
    if !has_magic(p) {
        return SuperblockCopy::Foreign;
    }
    if page.stored_crc() != page.computed_crc() {
        return SuperblockCopy::Corrupt(format!("superblock copy {slot}: checksum mismatch"));
    }
    // The payload is always `PAGE_PAYLOAD_SIZE` bytes, which hold every field; the
    // checked reads make that a fact of this function rather than of its caller.
    let fields = (|| {
        let version = le_u16(p, SB_VERSION)?;
        let page_size = le_u32(p, SB_PAGE_SIZE)?;
        let sb = Superblock {
            generation: le_u64(p, SB_GENERATION)?,
            high_water: le_u64(p, SB_HIGH_WATER)?,
            free_head: le_u64(p, SB_FREE_HEAD)?,
            free_count: le_u64(p, SB_FREE_COUNT)?,
            free_list_pages: le_u64(p, SB_FREE_LIST_PAGES)?,
        };
        Some((version, page_size, sb))
    })();
    let Some((version, page_size, sb)) = fields else {
        return SuperblockCopy::Corrupt(format!(
            "superblock copy {slot}: shorter than its {SUPERBLOCK_SIZE_BYTES} bytes of fields"
        ));
    };
    let header_version = page.version();
    if header_version != FORMAT_VERSION || version != FORMAT_VERSION {
        return SuperblockCopy::OtherFormat(format!(
            "format version {version} (page header says {header_version}); this build \
             understands version {FORMAT_VERSION}"
        ));
    }
    if page_size as usize != PAGE_SIZE {
        return SuperblockCopy::OtherFormat(format!(
            "page size {page_size}; this build uses {PAGE_SIZE}"
        ));
    }
    if page.kind_raw() != PageKind::Superblock as u16 {
        return SuperblockCopy::Corrupt(format!(
            "superblock copy {slot}: page kind is {}",
            page.kind_raw()
        ));
    }
    match sb.validate(slot) {
        Ok(()) => SuperblockCopy::Valid(sb),
        Err(reason) => SuperblockCopy::Corrupt(format!("superblock copy {slot}: {reason}")),
    }
}

/// Picks the superblock to trust from the two copies, or explains why there is none.
fn choose_superblock(copies: [SuperblockCopy; 2]) -> io::Result<Superblock> {
    // A copy of another format means another build has written this file; guessing
    // which copy it considers current would be unsafe, so refuse outright.
    for copy in &copies {
        if let SuperblockCopy::OtherFormat(reason) = copy {
            return Err(incompatible_file(reason.clone()));
        }
    }
    let newest = copies
        .iter()
        .filter_map(|c| match c {
            SuperblockCopy::Valid(sb) => Some(*sb),
            _ => None,
        })
        .max_by_key(|sb| sb.generation);
    if let Some(sb) = newest {
        return Ok(sb);
    }
    if copies.iter().all(|c| matches!(c, SuperblockCopy::Foreign)) {
        return Err(incompatible_file(
            "not a bfdb file: neither superblock slot carries the magic bytes",
        ));
    }
    let reasons: Vec<String> = copies
        .iter()
        .enumerate()
        .map(|(slot, c)| match c {
            SuperblockCopy::Corrupt(r) => r.clone(),
            _ => format!("superblock copy {slot}: no magic bytes"),
        })
        .collect();
    let first_bad = copies
        .iter()
        .position(|c| matches!(c, SuperblockCopy::Corrupt(_)))
        .unwrap_or(0) as u64;
    Err(corrupt_page(
        PageNo(first_bad),
        format!("both superblock copies are invalid: {}", reasons.join("; ")),
    ))
}

/// Reads both superblock copies of an existing file of `len` bytes and returns the one
/// to trust.
pub(super) fn read_superblock(file: &File, len: u64) -> io::Result<Superblock> {
    let mut pages = [Page::boxed(), Page::boxed()];
    if len < offset_of(FIRST_DATA_SLOT) {
        // Too short to hold both superblocks. Read what there is (a short read is
        // fine here) to tell a truncated bfdb file from a foreign one.
        let [first, _] = &mut pages;
        let _ = file.read_at(first.as_bytes_mut(), 0)?;
        if has_magic(first.payload()) {
            return Err(corrupt_page(
                PageNo(0),
                format!("the file is truncated: {len} bytes cannot hold its two superblocks"),
            ));
        }
        return Err(incompatible_file(format!(
            "not a bfdb file: {len} bytes long and no magic bytes"
        )));
    }
    for (slot, page) in (0u64..).zip(pages.iter_mut()) {
        file.read_exact_at(page.as_bytes_mut(), offset_of(slot))?;
    }
    let [first, second] = &pages;
    choose_superblock([
        classify_superblock(first, 0),
        classify_superblock(second, 1),
    ])
}

#[cfg(test)]
mod tests {
    use super::super::super::{CorruptPage, IncompatibleFile};
    use super::*;

    fn valid(generation: u64) -> Superblock {
        Superblock {
            generation,
            high_water: 10,
            free_head: 3,
            free_count: 4,
            free_list_pages: 1,
        }
    }

    #[test]
    fn superblock_round_trips() {
        let sb = valid(7);
        let page = sb.to_page();
        match classify_superblock(&page, 1) {
            SuperblockCopy::Valid(back) => assert_eq!(back, sb),
            other => panic!("expected valid, got {other:?}"),
        }
        // The same bytes in the wrong slot are inconsistent.
        assert!(matches!(
            classify_superblock(&page, 0),
            SuperblockCopy::Corrupt(_)
        ));
    }

    #[test]
    fn any_bytes_after_the_magic_decode_without_panicking() {
        // Checksum-valid pages of random fields: each is classified, never a panic, and
        // only a consistent one is trusted.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut page = Page::boxed();
            for b in page.payload_mut().iter_mut().take(64) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            page.payload_mut()
                .get_mut(SB_MAGIC)
                .unwrap()
                .copy_from_slice(&MAGIC);
            // Most pages carry this build's version and page size, so that decoding
            // reaches the consistency checks.
            if !x.is_multiple_of(8) {
                let p = page.payload_mut();
                p.get_mut(SB_VERSION)
                    .unwrap()
                    .copy_from_slice(&FORMAT_VERSION.to_le_bytes());
                p.get_mut(SB_PAGE_SIZE)
                    .unwrap()
                    .copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
            }
            page.stamp(PageKind::Superblock);
            for slot in 0..2 {
                if let SuperblockCopy::Valid(sb) = classify_superblock(&page, slot) {
                    assert!(sb.validate(slot).is_ok());
                }
            }
        }
    }

    #[test]
    fn superblock_validation_rejects_inconsistent_fields() {
        let cases = [
            Superblock {
                high_water: 1,
                ..valid(1)
            },
            Superblock {
                free_head: 0,
                ..valid(1)
            },
            Superblock {
                free_head: 10,
                ..valid(1)
            },
            Superblock {
                free_count: 9,
                ..valid(1)
            },
            Superblock {
                free_count: u64::MAX,
                ..valid(1)
            },
            Superblock {
                free_count: 600,
                high_water: 1000,
                ..valid(1)
            },
        ];
        for sb in cases {
            assert!(sb.validate(1).is_err(), "{sb:?}");
        }
        assert!(valid(1).validate(1).is_ok());
    }

    #[test]
    fn newest_valid_copy_wins_and_other_format_is_refused() {
        let chosen = choose_superblock([
            SuperblockCopy::Valid(valid(4)),
            SuperblockCopy::Valid(valid(5)),
        ])
        .unwrap();
        assert_eq!(chosen.generation, 5);
        let chosen = choose_superblock([
            SuperblockCopy::Valid(valid(4)),
            SuperblockCopy::Corrupt("torn".into()),
        ])
        .unwrap();
        assert_eq!(chosen.generation, 4);
        let err = choose_superblock([
            SuperblockCopy::Valid(valid(4)),
            SuperblockCopy::OtherFormat("v2".into()),
        ])
        .unwrap_err();
        assert!(err.get_ref().unwrap().is::<IncompatibleFile>());
        let err =
            choose_superblock([SuperblockCopy::Foreign, SuperblockCopy::Foreign]).unwrap_err();
        assert!(err.get_ref().unwrap().is::<IncompatibleFile>());
        let err = choose_superblock([
            SuperblockCopy::Foreign,
            SuperblockCopy::Corrupt("torn".into()),
        ])
        .unwrap_err();
        let c = err
            .get_ref()
            .unwrap()
            .downcast_ref::<CorruptPage>()
            .unwrap();
        assert_eq!(c.page, 1);
    }
}
