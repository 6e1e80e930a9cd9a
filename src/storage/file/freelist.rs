//! Allocation in a file store: the in-memory allocation state and the free-list pages
//! that persist it.
//!
//! Free-list page payload (after the page header of kind 3), little-endian:
//!
//! ```text
//! 0..8    next page of the chain, 0 at the end (u64)
//! 8..12   number of entries in this page (u32, at most FREE_LIST_ENTRIES_PER_PAGE)
//! 12..16  reserved, zero
//! 16..    entries: free page numbers (u64 each)
//! ```
//!
//! # Invariants this module owns
//!
//! - Every slot in `FIRST_DATA_SLOT..high_water` is in exactly one of: allocated,
//!   `free_recent`, `free_durable`, `withheld` ([`AllocState::is_allocated`] is the
//!   complement of the three sets).
//! - `free_recent` holds only slots the durable state calls allocated, so they are never
//!   used for a new chain (rule 2 of the parent module's crash argument).
//! - A chain loaded from disk is accepted only if it is exactly as long as its
//!   superblock records, visits no page twice, stays below the high-water mark, carries
//!   the superblock's generation on every page, and lists each free slot once and none
//!   of its own pages. Decoding accepts any bytes: every field is read through checked
//!   access, so bytes from disk never reach an unchecked index or an `unwrap`, and the
//!   walk is a loop bounded by the recorded page count, not recursion.

#![deny(clippy::indexing_slicing)]

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use super::super::corrupt_page;
use super::super::{PAGE_HEADER_SIZE, PAGE_PAYLOAD_SIZE, PAGE_SIZE, Page, PageKind, PageNo};
use super::{FIRST_DATA_SLOT, PAGE_SIZE_U64, le_u32, le_u64, offset_of};

// Free-list page payload offsets.
const FL_NEXT: Range<usize> = 0..8;
const FL_COUNT: Range<usize> = 8..12;
const FL_RESERVED: Range<usize> = 12..16;
const FL_ENTRIES_START: usize = 16;

const _: () = assert!(FL_NEXT.end == FL_COUNT.start);
const _: () = assert!(FL_COUNT.end == FL_RESERVED.start);
const _: () = assert!(FL_RESERVED.end == FL_ENTRIES_START);

/// How many free page numbers one free-list page holds.
pub const FREE_LIST_ENTRIES_PER_PAGE: usize = (PAGE_PAYLOAD_SIZE - FL_ENTRIES_START) / 8;

const _: () = assert!(FREE_LIST_ENTRIES_PER_PAGE == 508);
const _: () = assert!(PAGE_HEADER_SIZE + FL_ENTRIES_START + 8 * 508 <= PAGE_SIZE);

/// The allocation state, kept in memory and persisted at sync.
#[derive(Debug)]
pub(super) struct AllocState {
    /// Slots `0..high_water` exist; allocation past them extends the file.
    pub(super) high_water: u64,
    /// The high-water mark of the newest superblock, durable or being made durable by
    /// the running sync. Slots at or past it are unknown to the durable state.
    pub(super) durable_high_water: u64,
    /// Free slots that the durable state calls allocated: freed since the last sync.
    /// Never used for a free-list chain (rule 2 of the parent module's docs).
    pub(super) free_recent: BTreeSet<u64>,
    /// Free slots that the durable state also calls free, or that lie past its
    /// high-water mark: safe to overwrite with a new free-list chain.
    pub(super) free_durable: BTreeSet<u64>,
    /// Pages of the durable chain and of the chain a running sync is writing: neither
    /// free nor allocated.
    pub(super) withheld: BTreeSet<u64>,
    /// The pages of the durable chain, in chain order.
    pub(super) chain: Vec<u64>,
    /// The generation of the newest durable superblock.
    pub(super) generation: u64,
    /// The file length in bytes as this store knows it; `allocate` keeps it at or above
    /// `high_water * PAGE_SIZE`.
    pub(super) file_len_bytes: u64,
    /// How far past the file's start disk blocks were reserved (`fallocate` with
    /// `FALLOC_FL_KEEP_SIZE`) ahead of the file's length; at least `file_len_bytes`.
    pub(super) reserved_bytes: u64,
    /// The allocation state changed since the last superblock was planned.
    pub(super) dirty: bool,
}

impl AllocState {
    /// The state of a new store, whose superblocks of generations 0 and 1 are written.
    pub(super) fn empty() -> AllocState {
        AllocState {
            high_water: FIRST_DATA_SLOT,
            durable_high_water: FIRST_DATA_SLOT,
            free_recent: BTreeSet::new(),
            free_durable: BTreeSet::new(),
            withheld: BTreeSet::new(),
            chain: Vec::new(),
            generation: 1,
            file_len_bytes: offset_of(FIRST_DATA_SLOT),
            reserved_bytes: offset_of(FIRST_DATA_SLOT),
            dirty: false,
        }
    }

    /// Whether slot `no` is allocated to the client.
    pub(super) fn is_allocated(&self, no: u64) -> bool {
        (FIRST_DATA_SLOT..self.high_water).contains(&no)
            && !self.free_recent.contains(&no)
            && !self.free_durable.contains(&no)
            && !self.withheld.contains(&no)
    }

    /// Slots free for allocation right now.
    pub(super) fn free_pages(&self) -> u64 {
        (self.free_recent.len() + self.free_durable.len()) as u64
    }
}

/// What the trusted superblock records of the durable free-list chain.
#[derive(Clone, Copy, Debug)]
pub(super) struct ChainRecord {
    /// The superblock's generation, which every page of its chain carries as its lsn.
    pub(super) generation: u64,
    /// The superblock's high-water mark.
    pub(super) high_water: u64,
    /// The first page of the chain, 0 if there is none.
    pub(super) head: u64,
    /// How many pages the chain has.
    pub(super) pages: u64,
    /// How many free page numbers the chain lists.
    pub(super) entries: u64,
}

/// Encodes one page of a free-list chain into `page` and stamps its header: `entries`
/// (at most [`FREE_LIST_ENTRIES_PER_PAGE`]), the `next` page of the chain (0 at its end)
/// and the `generation` of the superblock that will point at the chain.
#[expect(
    clippy::indexing_slicing,
    reason = "constant field ranges within the payload (the const asserts above), and \
              entry `j` ends at 16 + 8 * (j + 1) <= 16 + 8 * 508 = PAGE_PAYLOAD_SIZE by the \
              assertion on `entries.len()`"
)]
pub(super) fn encode_page(page: &mut Page, next: u64, entries: &[u64], generation: u64) {
    assert!(entries.len() <= FREE_LIST_ENTRIES_PER_PAGE);
    page.as_bytes_mut().fill(0);
    let p = page.payload_mut();
    p[FL_NEXT].copy_from_slice(&next.to_le_bytes());
    p[FL_COUNT].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    for (j, entry) in entries.iter().enumerate() {
        let at = FL_ENTRIES_START + 8 * j;
        p[at..at + 8].copy_from_slice(&entry.to_le_bytes());
    }
    page.set_lsn(generation);
    page.stamp(PageKind::FreeList);
}

/// Reads the free-list chain `record` describes from `file` (of `len` bytes) and builds
/// the allocation state of the store.
pub(super) fn load_state(file: &File, len: u64, record: ChainRecord) -> io::Result<AllocState> {
    let mut free_durable = BTreeSet::new();
    let mut withheld = BTreeSet::new();
    let mut chain = Vec::new();
    let mut next = record.head;
    let mut page = Page::boxed();
    while next != 0 {
        let no = next;
        let here = PageNo(no);
        if chain.len() as u64 == record.pages {
            return Err(corrupt_page(
                here,
                format!(
                    "the free-list chain is longer than the {} pages its superblock records",
                    record.pages
                ),
            ));
        }
        if !(FIRST_DATA_SLOT..record.high_water).contains(&no) || !withheld.insert(no) {
            return Err(corrupt_page(
                PageNo(chain.last().copied().unwrap_or(0)),
                format!("the free-list chain points at page {no}, out of range or a repeat"),
            ));
        }
        chain.push(no);
        file.read_exact_at(page.as_bytes_mut(), offset_of(no))?;
        page.verify(here, PageKind::FreeList)?;
        // Every chain page carries the generation of the superblock that points at it.
        // A page of another generation is a slot that was reused after that superblock
        // was replaced: trusting its entries would free live pages.
        if page.lsn() != record.generation {
            return Err(corrupt_page(
                here,
                format!(
                    "free-list page of generation {}, but the superblock is generation {}",
                    page.lsn(),
                    record.generation
                ),
            ));
        }
        let (link, entries) = decode_page(&page, here)?;
        next = link;
        for entry in entries {
            if !(FIRST_DATA_SLOT..record.high_water).contains(&entry) || !free_durable.insert(entry)
            {
                return Err(corrupt_page(
                    here,
                    format!("free-list entry {entry} is out of range or listed twice"),
                ));
            }
        }
    }
    if chain.len() as u64 != record.pages || free_durable.len() as u64 != record.entries {
        return Err(corrupt_page(
            PageNo(chain.last().copied().unwrap_or(0)),
            format!(
                "the free-list chain has {} pages and {} entries; its superblock records {} \
                 and {}",
                chain.len(),
                free_durable.len(),
                record.pages,
                record.entries
            ),
        ));
    }
    if let Some(&both) = free_durable.intersection(&withheld).next() {
        return Err(corrupt_page(
            PageNo(both),
            "a free-list page lists itself or another free-list page as free",
        ));
    }

    // Slots past the durable high-water mark were allocated after the last sync; the
    // durable state does not know them, so they are free. A partial page at the end
    // (from a short write when the disk filled up) lies past the mark too and is
    // treated as a free slot: the first write to it completes it.
    let file_pages = len.div_ceil(PAGE_SIZE_U64);
    free_durable.extend(record.high_water..file_pages);
    Ok(AllocState {
        high_water: file_pages,
        durable_high_water: record.high_water,
        free_recent: BTreeSet::new(),
        free_durable,
        withheld,
        chain,
        generation: record.generation,
        file_len_bytes: len,
        reserved_bytes: len,
        dirty: false,
    })
}

/// Decodes a verified free-list page read from slot `here`: the next page of the chain
/// and the entries. A count larger than a page holds is corruption.
fn decode_page(page: &Page, here: PageNo) -> io::Result<(u64, impl Iterator<Item = u64>)> {
    let p = page.payload();
    let (Some(next), Some(count)) = (le_u64(p, FL_NEXT), le_u32(p, FL_COUNT)) else {
        return Err(corrupt_page(
            here,
            "free-list page too short for its header",
        ));
    };
    let count = count as usize;
    if count > FREE_LIST_ENTRIES_PER_PAGE {
        return Err(corrupt_page(
            here,
            format!(
                "free-list page claims {count} entries; at most {FREE_LIST_ENTRIES_PER_PAGE} fit"
            ),
        ));
    }
    let Some(bytes) = p.get(FL_ENTRIES_START..FL_ENTRIES_START + 8 * count) else {
        return Err(corrupt_page(
            here,
            format!("free-list page too short for {count} entries"),
        ));
    };
    let (entries, _) = bytes.as_chunks::<8>();
    Ok((next, entries.iter().map(|e| u64::from_le_bytes(*e))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_round_trips_and_an_oversized_count_is_corrupt() {
        let entries: Vec<u64> = (2..2 + FREE_LIST_ENTRIES_PER_PAGE as u64).collect();
        let mut page = Page::boxed();
        encode_page(&mut page, 77, &entries, 5);
        assert!(page.verify(PageNo(9), PageKind::FreeList).is_ok());
        assert_eq!(page.lsn(), 5);
        let (next, back) = decode_page(&page, PageNo(9)).unwrap();
        assert_eq!(next, 77);
        assert_eq!(back.collect::<Vec<_>>(), entries);

        // A count one past the capacity, with any bytes after it, is refused rather
        // than read past the page.
        let count = (FREE_LIST_ENTRIES_PER_PAGE as u32 + 1).to_le_bytes();
        page.payload_mut()
            .get_mut(FL_COUNT)
            .unwrap()
            .copy_from_slice(&count);
        let err = decode_page(&page, PageNo(9)).err().unwrap();
        assert!(err.to_string().contains("509 entries"), "{err}");
        let count = u32::MAX.to_le_bytes();
        page.payload_mut()
            .get_mut(FL_COUNT)
            .unwrap()
            .copy_from_slice(&count);
        assert!(decode_page(&page, PageNo(9)).is_err());
    }
}
