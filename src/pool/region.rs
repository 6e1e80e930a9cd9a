//! The circular buffer's one memory region: an anonymous mapping of exactly the
//! configured capacity, and the raw accessors for the header words and payloads laid
//! over it.
//!
//! This is where the pool's raw-memory `unsafe` lives. The region owns its mapping and
//! unmaps it on drop; everything else addresses it by physical offset.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64 as RegionAtomicU64;

use super::header::Header;

/// The size of an explicit huge page on x86-64 and aarch64 Linux.
const HUGE_PAGE_SIZE_BYTES: usize = 2 << 20;

/// How the region's memory was obtained, reported for benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// `mmap(MAP_HUGETLB)`: explicit 2 MiB huge pages.
    HugeTlb,
    /// A normal anonymous mapping with `madvise(MADV_HUGEPAGE)` (transparent huge
    /// pages, if the kernel grants them).
    TransparentHugePages,
    /// A normal anonymous mapping.
    Normal,
}

/// An anonymous, private, read-write mapping of `len_bytes` bytes.
pub(crate) struct Region {
    base: NonNull<u8>,
    len_bytes: usize,
    backing: Backing,
}

// SAFETY: the region is a plain block of memory owned by this value; all concurrent
// access to its bytes goes through atomics (headers) or is ordered by the pool's
// protocol (payloads), so sharing or moving the owner between threads is sound.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` hands out only raw pointers and atomics.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len_bytes` of zeroed memory. With `huge_pages`, tries explicit huge pages
    /// first when the length allows, then falls back silently to a normal mapping
    /// advised to use transparent huge pages.
    pub(crate) fn map(len_bytes: usize, huge_pages: bool) -> io::Result<Region> {
        assert!(len_bytes > 0 && len_bytes.is_multiple_of(8));
        if huge_pages
            && len_bytes.is_multiple_of(HUGE_PAGE_SIZE_BYTES)
            && let Some(base) = mmap_anonymous(len_bytes, libc::MAP_HUGETLB)
        {
            return Ok(Region {
                base,
                len_bytes,
                backing: Backing::HugeTlb,
            });
        }
        let base = mmap_anonymous(len_bytes, 0).ok_or_else(io::Error::last_os_error)?;
        let mut backing = Backing::Normal;
        if huge_pages {
            // SAFETY: `base..base+len_bytes` is exactly the mapping just created; madvise
            // only changes the kernel's paging policy for it, never its contents.
            let rc = unsafe { libc::madvise(base.as_ptr().cast(), len_bytes, libc::MADV_HUGEPAGE) };
            // Failure (for example a kernel without THP) only costs TLB misses.
            if rc == 0 {
                backing = Backing::TransparentHugePages;
            }
        }
        Ok(Region {
            base,
            len_bytes,
            backing,
        })
    }

    /// The physical offset of logical address `addr`.
    pub(crate) fn offset_of(&self, addr: u64) -> u64 {
        addr % self.len_bytes as u64
    }

    /// How the memory was obtained.
    pub(crate) fn backing(&self) -> Backing {
        self.backing
    }

    /// The header word at physical `offset`.
    ///
    /// # Safety
    ///
    /// `offset` must be 8-aligned, `offset + 8 <= len`, and the word must currently be a
    /// header position in the pool's protocol sense: every non-atomic access to these 8
    /// bytes (payload writes of an earlier lap, zeroing) happens-before this call and
    /// none happens concurrently with the returned reference's use.
    pub(crate) unsafe fn header(&self, offset: u64) -> &RegionAtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.len_bytes as u64);
        // SAFETY: in bounds and 8-aligned by the caller's contract (the base is page
        // aligned); the caller guarantees no racing non-atomic access, which is what
        // `AtomicU64::from_ptr` requires. The mapping lives as long as `&self`.
        unsafe { RegionAtomicU64::from_ptr(self.base.as_ptr().add(offset as usize).cast()) }
    }

    /// Loads the header at `offset` (Acquire).
    ///
    /// # Safety
    ///
    /// As for [`Region::header`].
    pub(crate) unsafe fn load_header(&self, offset: u64) -> Header {
        // SAFETY: forwarded to the caller.
        Header(unsafe { self.header(offset) }.load(std::sync::atomic::Ordering::Acquire))
    }

    /// A pointer to byte `offset` of the region.
    pub(crate) fn ptr_at(&self, offset: u64) -> NonNull<u8> {
        assert!(offset <= self.len_bytes as u64);
        // SAFETY: `offset` is at most one past the end of the mapping, which is a valid
        // pointer computation within (or just past) one allocation.
        unsafe { self.base.add(offset as usize) }
    }

    /// Zeroes `len_bytes` bytes at physical `offset`.
    ///
    /// # Safety
    ///
    /// The range must lie in the region and the caller must own it exclusively: no other
    /// thread accesses these bytes until a release operation published after this call.
    pub(crate) unsafe fn zero(&self, offset: u64, len_bytes: u64) {
        debug_assert!(offset + len_bytes <= self.len_bytes as u64);
        // SAFETY: in bounds and exclusively owned by the caller's contract.
        unsafe {
            self.ptr_at(offset)
                .as_ptr()
                .write_bytes(0, len_bytes as usize)
        };
    }

    /// Gives `len_bytes` at physical `offset` back to the operating system; they read
    /// as zero afterwards (the mapping is private and anonymous), and memory is taken
    /// again when they are next written. A failure (an old kernel refusing it on
    /// explicit huge pages) leaves the bytes as they were.
    ///
    /// # Safety
    ///
    /// As for [`Region::zero`], and `offset` must be a multiple of the page size.
    pub(crate) unsafe fn release(&self, offset: u64, len_bytes: u64) {
        debug_assert!(offset + len_bytes <= self.len_bytes as u64);
        // SAFETY: the range lies in this mapping (caller) and is page aligned (the base
        // is); nobody uses its bytes (caller), and MADV_DONTNEED on a private anonymous
        // mapping only replaces them with zero-filled pages on next touch.
        unsafe {
            libc::madvise(
                self.ptr_at(offset).as_ptr().cast(),
                len_bytes as usize,
                libc::MADV_DONTNEED,
            )
        };
    }

    /// Reads the u64 at physical `offset` non-atomically (free-list links).
    ///
    /// # Safety
    ///
    /// 8-aligned, in bounds, and no concurrent write to these bytes.
    pub(crate) unsafe fn read_word(&self, offset: u64) -> u64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.len_bytes as u64);
        // SAFETY: aligned, in bounds and not racing by the caller's contract.
        unsafe { self.ptr_at(offset).cast::<u64>().read() }
    }

    /// Writes the u64 at physical `offset` non-atomically (free-list links).
    ///
    /// # Safety
    ///
    /// 8-aligned, in bounds, and no concurrent access to these bytes.
    pub(crate) unsafe fn write_word(&self, offset: u64, value: u64) {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.len_bytes as u64);
        // SAFETY: aligned, in bounds and exclusively accessed by the caller's contract.
        unsafe { self.ptr_at(offset).cast::<u64>().write(value) };
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `base`/`len_bytes` describe exactly the mapping created in `map`, and
        // dropping the owner means no pool method can touch it any more.
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.len_bytes) };
        debug_assert_eq!(rc, 0, "munmap of the pool region failed");
    }
}

/// `mmap(NULL, len, RW, PRIVATE|ANONYMOUS|extra_flags)`, or `None` on failure.
fn mmap_anonymous(len_bytes: usize, extra_flags: libc::c_int) -> Option<NonNull<u8>> {
    // SAFETY: an anonymous mapping with a null hint touches no existing memory; the
    // result is checked against MAP_FAILED before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len_bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        None
    } else {
        NonNull::new(p.cast())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_is_zeroed_and_writable() {
        let r = Region::map(4096, true).unwrap();
        // 4 KiB is not a huge-page multiple, so explicit huge pages are never tried.
        assert_ne!(r.backing(), Backing::HugeTlb);
        // SAFETY: single-threaded test; offsets are aligned and in bounds.
        unsafe {
            assert_eq!(r.read_word(4088), 0);
            r.write_word(4088, 7);
            assert_eq!(r.read_word(4088), 7);
            r.zero(4080, 16);
            assert_eq!(r.read_word(4088), 0);
            assert_eq!(r.load_header(0), Header::UNPUBLISHED);
        }
    }

    #[test]
    fn huge_page_request_falls_back_silently() {
        // Whether or not the machine has reserved huge pages, mapping must succeed.
        let r = Region::map(HUGE_PAGE_SIZE_BYTES, true).unwrap();
        // SAFETY: single-threaded test; offset aligned and in bounds.
        unsafe {
            r.write_word(HUGE_PAGE_SIZE_BYTES as u64 - 8, 1);
            assert_eq!(r.read_word(HUGE_PAGE_SIZE_BYTES as u64 - 8), 1);
        }
        let n = Region::map(HUGE_PAGE_SIZE_BYTES, false).unwrap();
        assert_eq!(n.backing(), Backing::Normal);
    }
}
