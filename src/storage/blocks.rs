//! Append-addressed files of blocks: a device that stores whole blocks at a byte
//! address of one large address space and reads any aligned range back, and gives up
//! everything below an address when its client no longer needs it. The hash tier keeps
//! each hybrid log on one (FASTER, section 5.1: one address space over memory and
//! disk, the log's logical address being the device's); the storage layer moves the
//! bytes and never interprets them. The value store (`values`) keeps the database's
//! large values on one too, giving space back in the middle ([`BlockDevice::discard`])
//! and at the top ([`BlockDevice::truncate_from`]).
//!
//! A [`BlockDevice`] writes whole blocks at their address and reads any aligned range
//! back; [`BlockDevice::truncate_before`] gives up everything below an address.
//! [`SegmentFiles`] keeps the address space in segment files of a fixed size
//! (`<prefix>-<segment as 8 hex digits>.<extension>`), so that a truncation deletes
//! whole files; `MemBlocks` keeps it in memory for tests; [`SimBlocks`] (in `sim`)
//! is the crash-testing one; [`Retaining`] holds truncations back at a floor.
//! [`AlignedBuf`] is the buffer of their IO: heap bytes aligned for `O_DIRECT`.
//!
//! Invariants this module owns:
//! - No write or read straddles two segment files (asserted): a client writes units
//!   (a hash log's pages) at multiples of their size, and a segment holds a whole
//!   number of them, or splits its accesses at [`BlockDevice::segment_bytes`] (the
//!   value store).
//! - A segment file's bytes are durable only with its name: a sync after a file was
//!   created syncs the directory too.
//! - Writes are [`IO_ALIGN_BYTES`]-aligned in offset and length. Reads are aligned to
//!   the device's [`BlockDevice::read_align`]: 512-byte sectors for segment files, so a
//!   small read costs a sector or two, not a 4 KiB block. Where O_DIRECT refuses
//!   sector-aligned reads (a device of 4 KiB logical blocks), the files fall back to
//!   4 KiB-aligned reads through a bounce buffer, once and for good.
//! - Nothing is read below the truncation point: such a read is an error, never stale
//!   bytes of a deleted segment.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use super::file::{name_path, open_maybe_direct};
use super::{PAGE_SIZE, SECTOR_BYTES, SimBlocks};
use crate::sync::Mutex;

/// The alignment of every device write, in offset and length, of reads on devices that
/// allow nothing smaller, and of [`AlignedBuf`]s: a page of the storage layer.
pub(crate) const IO_ALIGN_BYTES: u64 = PAGE_SIZE as u64;
/// The smallest read alignment a device may allow (a disk sector).
const SECTOR: u64 = SECTOR_BYTES as u64;

/// A device of blocks addressed by byte address, in one address space that grows at the
/// top and is given up from the bottom (a hash log), or whose client gives back ranges
/// anywhere and lowers the top (the value store).
pub(crate) trait BlockDevice: Send + Sync {
    /// Writes `bytes` (whole blocks) at `address`. Both are aligned to
    /// [`IO_ALIGN_BYTES`], and `bytes` in memory too where the device uses `O_DIRECT`.
    fn write(&self, address: u64, bytes: &[u8]) -> io::Result<()>;
    /// Reads `buf.len()` bytes at `address` (both aligned to [`BlockDevice::read_align`], and
    /// `buf` in memory to [`IO_ALIGN_BYTES`]). Bytes never written read as zeros; bytes
    /// below the truncation point are an error.
    fn read(&self, address: u64, buf: &mut [u8]) -> io::Result<()>;
    /// The alignment reads need, in offset and length.
    fn read_align(&self) -> u64 {
        IO_ALIGN_BYTES
    }
    /// Where a read of `len` bytes at `address` (aligned as for [`BlockDevice::read`]) can
    /// be submitted by the caller, as an offset into an open file, so that many reads
    /// go to the device at once (io_uring); `None` if the caller must use
    /// [`BlockDevice::read`]. The file stays readable as long as the caller holds it,
    /// whatever truncations happen meanwhile (its bytes at the offset do not change).
    fn read_target(&self, _address: u64, _len: usize) -> Option<(Arc<File>, u64)> {
        None
    }
    /// Where a write of `len` bytes at `address` (aligned as for [`BlockDevice::write`])
    /// can be submitted by the caller, as an offset into an open file, so that many
    /// writes go to the device at once (io_uring); `None` if the caller must use
    /// [`BlockDevice::write`]. The write counts for the next [`BlockDevice::sync`] as
    /// one through `write` would.
    #[cfg_attr(
        feature = "shuttle",
        allow(dead_code, reason = "shuttle builds write synchronously")
    )]
    fn write_target(&self, _address: u64, _len: usize) -> Option<(Arc<File>, u64)> {
        None
    }
    /// The file that holds `address`, for errors about its bytes; `None` for devices
    /// without files.
    fn file_of(&self, _address: u64) -> Option<PathBuf> {
        None
    }
    /// Makes every write so far durable.
    fn sync(&self) -> io::Result<()>;
    /// Gives up every address below `address` (the device may keep part of it).
    fn truncate_before(&self, address: u64) -> io::Result<()>;
    /// The size of the device's segments, if it keeps the address space in pieces that
    /// no single read or write may straddle (segment files); `None` if any access may
    /// span any range.
    fn segment_bytes(&self) -> Option<u64> {
        None
    }
    /// How many of the `len` bytes of an access at `address` lie in the segment holding
    /// `address`: the most one read or write there may take.
    fn segment_piece(&self, address: u64, len: u64) -> u64 {
        match self.segment_bytes() {
            Some(segment) => len.min(segment - address % segment),
            None => len,
        }
    }
    /// The error for damaged bytes at `address`: [`Error::CorruptFile`] naming the file
    /// that holds them where the device has files, else [`Error::Corrupted`].
    ///
    /// [`Error::CorruptFile`]: crate::Error::CorruptFile
    /// [`Error::Corrupted`]: crate::Error::Corrupted
    fn damaged(&self, address: u64, reason: String) -> crate::error::Error {
        match self.file_of(address) {
            Some(path) => crate::error::Error::CorruptFile { path, reason },
            None => crate::error::Error::Corrupted {
                page: address,
                reason,
            },
        }
    }
    /// Tells the device that the `len` bytes at `address` (both aligned to
    /// [`IO_ALIGN_BYTES`]) are no longer needed, so that it may give their space back
    /// (segment files punch a hole). It is advice: until they are written again, the
    /// bytes read as what they were, as zeros, or (for a segment file that is gone) as
    /// an error. The caller must not write the range while the call runs.
    fn discard(&self, _address: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Allocates the space of the `len` bytes at `address` (both aligned to
    /// [`IO_ALIGN_BYTES`]) ahead of their writes, so that writing them later overwrites
    /// instead of growing the device (segment files `fallocate`; a filesystem that
    /// cannot is left to allocate as it writes). Out of space is an error.
    fn reserve(&self, _address: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Gives up every address from `end` (aligned to [`IO_ALIGN_BYTES`]) up: the address
    /// space now ends there, and the device may shrink to it (segment files remove the
    /// files wholly above it and cut the one holding it short). Reads above `end` see
    /// zeros or an error until written again. The caller must not write above `end`
    /// while the call runs.
    fn truncate_from(&self, _end: u64) -> io::Result<()> {
        Ok(())
    }
}

/// Segment files in a directory, each holding `segment_bytes` of the address space.
pub(crate) struct SegmentFiles {
    dir: PathBuf,
    prefix: String,
    extension: String,
    segment_bytes: u64,
    direct: bool,
    /// A sector, until O_DIRECT refuses a read that small.
    read_align: std::sync::atomic::AtomicU64,
    state: Mutex<FileState>,
}

#[derive(Default)]
struct FileState {
    /// Open segments, shared so that IO runs outside the lock.
    open: HashMap<u64, Arc<File>>,
    /// Segments below this were deleted.
    truncated_segments: u64,
    /// Segments written since the last sync.
    dirty: Vec<u64>,
    /// A segment file may have been created since the last sync: the directory's entry
    /// for it is durable only once the directory is synced too.
    dir_dirty: bool,
    /// No segment file numbered this or higher exists, once known (`truncate_from`
    /// lists the directory the first time).
    segments_below: Option<u64>,
}

impl SegmentFiles {
    /// Segment files `<dir>/<prefix>-<n as 8 hex digits>.<extension>` of
    /// `segment_bytes` each (a multiple of [`IO_ALIGN_BYTES`]), opened with `O_DIRECT`
    /// if `direct` and the filesystem allows it.
    pub(crate) fn new(
        dir: &Path,
        (prefix, extension): (&str, &str),
        segment_bytes: u64,
        direct: bool,
    ) -> SegmentFiles {
        assert!(segment_bytes > 0 && segment_bytes.is_multiple_of(IO_ALIGN_BYTES));
        SegmentFiles {
            dir: dir.to_path_buf(),
            prefix: prefix.to_string(),
            extension: extension.to_string(),
            segment_bytes,
            direct,
            read_align: std::sync::atomic::AtomicU64::new(SECTOR),
            state: Mutex::new(FileState::default()),
        }
    }

    fn path(&self, segment: u64) -> PathBuf {
        let (prefix, extension) = (&self.prefix, &self.extension);
        self.dir.join(format!("{prefix}-{segment:08x}.{extension}"))
    }

    /// Runs `f` on segment `segment`'s file, opening (or creating) it first. The lock
    /// is held only to find the file: reads and writes of several threads go to the
    /// device at once.
    fn with_file<T>(
        &self,
        segment: u64,
        create: bool,
        f: impl FnOnce(&File) -> io::Result<T>,
    ) -> io::Result<T> {
        let file = self.file(segment, create)?;
        f(&file)
    }

    /// Segment `segment`'s file, opened (or created) if it is not yet.
    fn file(&self, segment: u64, create: bool) -> io::Result<Arc<File>> {
        let mut state = self.state.lock();
        if segment < state.truncated_segments {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: segment {segment} was truncated", self.prefix),
            ));
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = state.open.entry(segment) {
            let mut options = OpenOptions::new();
            options.read(true).write(true).create(create);
            let path = self.path(segment);
            // A filesystem that refuses O_DIRECT (tmpfs) gets buffered IO.
            let (file, _direct) = open_maybe_direct(&options, &path, self.direct)
                .map_err(|e| name_path(Some(&path), e))?;
            slot.insert(Arc::new(file));
            if create {
                state.dir_dirty = true;
                if let Some(below) = &mut state.segments_below {
                    *below = (*below).max(segment + 1);
                }
            }
        }
        if create && !state.dirty.contains(&segment) {
            state.dirty.push(segment);
        }
        Ok(Arc::clone(&state.open[&segment]))
    }

    /// Segment `segment`'s file if it exists (and was not truncated).
    fn existing_file(&self, segment: u64) -> io::Result<Option<Arc<File>>> {
        if segment < self.state.lock().truncated_segments {
            return Ok(None);
        }
        match self.file(segment, false) {
            Ok(file) => Ok(Some(file)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One more than the highest segment number of this device's files in the
    /// directory (0 if there are none).
    fn segments_on_disk(&self) -> io::Result<u64> {
        let mut below = 0;
        let entries = std::fs::read_dir(&self.dir).map_err(|e| name_path(Some(&self.dir), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| name_path(Some(&self.dir), e))?;
            let name = entry.file_name();
            let number = name
                .to_str()
                .and_then(|n| n.strip_prefix(self.prefix.as_str()))
                .and_then(|n| n.strip_prefix('-'))
                .and_then(|n| n.strip_suffix(self.extension.as_str()))
                .and_then(|n| n.strip_suffix('.'))
                .filter(|n| n.len() == 8)
                .and_then(|n| u64::from_str_radix(n, 16).ok());
            if let Some(segment) = number {
                below = below.max(segment + 1);
            }
        }
        Ok(below)
    }

    /// Reads `buf` at `address` from its segment; past the end of what was written
    /// reads zeros, as in a sparse file.
    fn read_exact_at(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        let (segment, offset) = self.split(address, buf.len());
        self.with_file(segment, false, |f| {
            let done = read_up_to(f, offset, buf)?;
            buf[done..].fill(0);
            Ok(())
        })
    }

    /// Reads `buf` at `address` through a buffer of the whole 4 KiB blocks around it.
    fn read_through_blocks(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        let start = address - address % IO_ALIGN_BYTES;
        let end = (address + buf.len() as u64).div_ceil(IO_ALIGN_BYTES) * IO_ALIGN_BYTES;
        let mut blocks = AlignedBuf::new((end - start) as usize);
        self.read_exact_at(start, blocks.as_mut())?;
        let at = (address - start) as usize;
        buf.copy_from_slice(&blocks.as_mut()[at..at + buf.len()]);
        Ok(())
    }

    fn split(&self, address: u64, len: usize) -> (u64, u64) {
        let (segment, offset) = (address / self.segment_bytes, address % self.segment_bytes);
        assert!(
            offset + len as u64 <= self.segment_bytes,
            "an access straddles two segments"
        );
        (segment, offset)
    }
}

/// Reads `buf` at `offset` of `file` as far as the file goes, retrying short reads;
/// returns how many bytes were read (fewer than `buf.len()` only at the file's end).
pub(crate) fn read_up_to(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let n = file.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(done)
}

fn check_aligned(address: u64, len: usize, align: u64) {
    assert!(
        address.is_multiple_of(align) && (len as u64).is_multiple_of(align),
        "unaligned block IO at {address} of {len} bytes"
    );
}

impl BlockDevice for SegmentFiles {
    fn write(&self, address: u64, bytes: &[u8]) -> io::Result<()> {
        check_aligned(address, bytes.len(), IO_ALIGN_BYTES);
        let (segment, offset) = self.split(address, bytes.len());
        self.with_file(segment, true, |f| f.write_all_at(bytes, offset))
    }

    fn read(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        check_aligned(address, buf.len(), SECTOR);
        let whole_blocks = address.is_multiple_of(IO_ALIGN_BYTES)
            && (buf.len() as u64).is_multiple_of(IO_ALIGN_BYTES);
        if !whole_blocks && self.read_align() == IO_ALIGN_BYTES {
            return self.read_through_blocks(address, buf);
        }
        match self.read_exact_at(address, buf) {
            // O_DIRECT on a device of 4 KiB logical blocks: from now on reads are
            // 4 KiB-aligned (callers ask `read_align` before each read).
            Err(e) if !whole_blocks && e.raw_os_error() == Some(libc::EINVAL) => {
                self.read_align
                    .store(IO_ALIGN_BYTES, std::sync::atomic::Ordering::Relaxed);
                self.read_through_blocks(address, buf)
            }
            other => other,
        }
    }

    fn read_align(&self) -> u64 {
        self.read_align.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The segment file and offset, unless the read straddles segments or the files
    /// read through 4 KiB bounce buffers (after O_DIRECT refused a sector read) and
    /// this read is not whole blocks. A submitted read that fails (O_DIRECT refusing
    /// it among them) is for the caller to repeat with [`BlockDevice::read`].
    fn read_target(&self, address: u64, len: usize) -> Option<(Arc<File>, u64)> {
        let (segment, offset) = (address / self.segment_bytes, address % self.segment_bytes);
        let whole_blocks =
            address.is_multiple_of(IO_ALIGN_BYTES) && (len as u64).is_multiple_of(IO_ALIGN_BYTES);
        if offset + len as u64 > self.segment_bytes
            || (!whole_blocks && self.read_align() == IO_ALIGN_BYTES)
        {
            return None;
        }
        self.file(segment, false).ok().map(|file| (file, offset))
    }

    /// The segment file (created, and marked for the next sync) and offset, unless the
    /// write straddles segments.
    fn write_target(&self, address: u64, len: usize) -> Option<(Arc<File>, u64)> {
        let (segment, offset) = (address / self.segment_bytes, address % self.segment_bytes);
        if offset + len as u64 > self.segment_bytes
            || !address.is_multiple_of(IO_ALIGN_BYTES)
            || !(len as u64).is_multiple_of(IO_ALIGN_BYTES)
        {
            return None;
        }
        self.file(segment, true).ok().map(|file| (file, offset))
    }

    fn file_of(&self, address: u64) -> Option<PathBuf> {
        Some(self.path(address / self.segment_bytes))
    }

    fn sync(&self) -> io::Result<()> {
        let (files, dir_dirty): (Vec<(u64, Arc<File>)>, bool) = {
            let mut state = self.state.lock();
            let dirty = std::mem::take(&mut state.dirty);
            let files = dirty
                .into_iter()
                .filter_map(|s| state.open.get(&s).map(|f| (s, Arc::clone(f))))
                .collect();
            (files, std::mem::take(&mut state.dir_dirty))
        };
        // Synced outside the lock (reads go on); a segment that fails stays dirty.
        for (i, (_, f)) in files.iter().enumerate() {
            if let Err(e) = f.sync_data() {
                let mut state = self.state.lock();
                for (s, _) in &files[i..] {
                    if !state.dirty.contains(s) {
                        state.dirty.push(*s);
                    }
                }
                state.dir_dirty |= dir_dirty;
                return Err(e);
            }
        }
        // A new segment file's bytes are durable only with its directory entry.
        if dir_dirty && let Err(e) = File::open(&self.dir).and_then(|d| d.sync_all()) {
            self.state.lock().dir_dirty = true;
            return Err(name_path(Some(&self.dir), e));
        }
        Ok(())
    }

    fn truncate_before(&self, address: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        let below = address / self.segment_bytes;
        for segment in state.truncated_segments..below {
            state.open.remove(&segment);
            state.dirty.retain(|&s| s != segment);
            match std::fs::remove_file(self.path(segment)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        state.truncated_segments = state.truncated_segments.max(below);
        Ok(())
    }

    fn segment_bytes(&self) -> Option<u64> {
        Some(self.segment_bytes)
    }

    /// Punches a hole (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`) in each segment
    /// file the range touches; segments whose file does not exist hold nothing to give
    /// back. A filesystem that cannot punch holes keeps the bytes.
    fn discard(&self, address: u64, len: u64) -> io::Result<()> {
        check_aligned(address, 0, IO_ALIGN_BYTES);
        assert!(
            len.is_multiple_of(IO_ALIGN_BYTES),
            "unaligned discard of {len} bytes"
        );
        let end = address + len;
        let mut at = address;
        while at < end {
            let (segment, offset) = (at / self.segment_bytes, at % self.segment_bytes);
            let n = (self.segment_bytes - offset).min(end - at);
            if let Some(file) = self.existing_file(segment)? {
                punch_hole(&file, offset, n)
                    .map_err(|e| name_path(Some(&self.path(segment)), e))?;
            }
            at += n;
        }
        Ok(())
    }

    /// Allocates the range in each segment file it touches (`fallocate` mode 0, which
    /// also grows the file over it), creating the files.
    fn reserve(&self, address: u64, len: u64) -> io::Result<()> {
        check_aligned(address, 0, IO_ALIGN_BYTES);
        let end = address + len;
        let mut at = address;
        while at < end {
            let (segment, offset) = (at / self.segment_bytes, at % self.segment_bytes);
            let n = (self.segment_bytes - offset).min(end - at);
            let file = self.file(segment, true)?;
            allocate(&file, offset, n).map_err(|e| name_path(Some(&self.path(segment)), e))?;
            at += n;
        }
        Ok(())
    }

    /// Removes the segment files wholly at or above `end` and cuts the one holding
    /// `end` to its part below it. The first call lists the directory, to find files a
    /// previous process left above the end; later ones know the highest file.
    fn truncate_from(&self, end: u64) -> io::Result<()> {
        check_aligned(end, 0, IO_ALIGN_BYTES);
        let first_whole = end.div_ceil(self.segment_bytes);
        let known = self.state.lock().segments_below;
        let below = match known {
            Some(below) => below,
            None => self.segments_on_disk()?,
        };
        let mut state = self.state.lock();
        // Removed under the lock: a file of a segment being removed is not reopened
        // meanwhile (the caller writes nothing above `end` anyway).
        for segment in first_whole..below.max(state.segments_below.unwrap_or(0)) {
            state.open.remove(&segment);
            state.dirty.retain(|&s| s != segment);
            match std::fs::remove_file(self.path(segment)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(name_path(Some(&self.path(segment)), e)),
            }
        }
        state.segments_below = Some(first_whole);
        drop(state);
        let (segment, offset) = (end / self.segment_bytes, end % self.segment_bytes);
        if offset > 0
            && let Some(file) = self.existing_file(segment)?
        {
            file.set_len(offset)
                .map_err(|e| name_path(Some(&self.path(segment)), e))?;
        }
        Ok(())
    }
}

/// Gives the `len` bytes at `offset` of `file` back to the filesystem, keeping the
/// file's size; they read as zeros. Without hole punching (`EOPNOTSUPP`) the bytes stay.
fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fallocate(
        file,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        offset,
        len,
    )
}

/// Allocates `[offset, offset + len)` of `file`, growing it over the range (a
/// filesystem that cannot allocate ahead is left to do it as it writes).
fn allocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fallocate(file, 0, offset, len)
}

/// `fallocate(2)` in `mode` on `[offset, offset + len)` of `file`; a filesystem that
/// does not support the mode answers `Ok` (the call is advice).
fn fallocate(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let too_far = || io::Error::new(io::ErrorKind::InvalidInput, "a range beyond i64::MAX");
    let offset = libc::off_t::try_from(offset).map_err(|_| too_far())?;
    let len = libc::off_t::try_from(len).map_err(|_| too_far())?;
    // SAFETY: fallocate on a descriptor `file` owns and keeps open for the call; no
    // memory is passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        return Ok(());
    }
    Err(e)
}

impl BlockDevice for SimBlocks {
    fn write(&self, address: u64, bytes: &[u8]) -> io::Result<()> {
        SimBlocks::write(self, address, bytes)
    }

    fn read(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        SimBlocks::read(self, address, buf)
    }

    fn sync(&self) -> io::Result<()> {
        SimBlocks::sync(self)
    }

    fn truncate_before(&self, address: u64) -> io::Result<()> {
        self.discard_below(address);
        Ok(())
    }

    fn discard(&self, address: u64, len: u64) -> io::Result<()> {
        SimBlocks::discard(self, address, len);
        Ok(())
    }

    fn truncate_from(&self, end: u64) -> io::Result<()> {
        self.discard_from(end);
        Ok(())
    }
}

/// A device whose truncations stop at a floor: the part of the address space that a
/// checkpoint still kept needs stays on the device until that checkpoint is retired
/// (the client's own start, a hash log's BEGIN, may move past it meanwhile; nothing
/// reads below that start).
pub(crate) struct Retaining {
    inner: Arc<dyn BlockDevice>,
    /// (the highest truncation asked for, the floor).
    state: Mutex<(u64, u64)>,
}

impl Retaining {
    /// `inner`, keeping everything from `floor` up (0 keeps everything).
    pub(crate) fn new(inner: Arc<dyn BlockDevice>, floor: u64) -> Retaining {
        Retaining {
            inner,
            state: Mutex::new((0, floor)),
        }
    }

    /// Bytes the floor keeps below `begin` (the client's start) that a truncation asked
    /// to give up.
    pub(crate) fn held_below(&self, begin: u64) -> u64 {
        begin.saturating_sub(self.state.lock().1)
    }

    /// Moves the floor up to `floor` (once the checkpoints that needed what is below it
    /// are retired) and gives up what is below both it and the truncation asked for.
    pub(crate) fn retain_from(&self, floor: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        state.1 = state.1.max(floor);
        self.inner.truncate_before(state.0.min(state.1))
    }
}

impl BlockDevice for Retaining {
    fn write(&self, address: u64, bytes: &[u8]) -> io::Result<()> {
        self.inner.write(address, bytes)
    }

    fn read(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read(address, buf)
    }

    fn read_align(&self) -> u64 {
        self.inner.read_align()
    }

    fn read_target(&self, address: u64, len: usize) -> Option<(Arc<File>, u64)> {
        self.inner.read_target(address, len)
    }

    fn file_of(&self, address: u64) -> Option<PathBuf> {
        self.inner.file_of(address)
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }

    fn truncate_before(&self, address: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        state.0 = state.0.max(address);
        self.inner.truncate_before(state.0.min(state.1))
    }

    fn segment_bytes(&self) -> Option<u64> {
        self.inner.segment_bytes()
    }

    fn discard(&self, address: u64, len: u64) -> io::Result<()> {
        self.inner.discard(address, len)
    }

    fn truncate_from(&self, end: u64) -> io::Result<()> {
        self.inner.truncate_from(end)
    }
}

/// A device in memory, block by block, for tests; counts its IO.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct MemBlocks {
    state: Mutex<MemState>,
    /// Segments no access may straddle (asserted) and that name files, as segment
    /// files do; `None`: one address space.
    segment_bytes: Option<u64>,
}

#[cfg(test)]
#[derive(Default)]
struct MemState {
    blocks: HashMap<u64, Box<[u8]>>,
    truncated_before: u64,
    /// Bytes written and read.
    written_bytes: u64,
    read_bytes: u64,
    /// Fail every write from now on.
    fail_writes: bool,
    /// Fail this many of the next reads.
    fail_reads: u64,
}

#[cfg(test)]
impl MemBlocks {
    pub(crate) fn new() -> MemBlocks {
        MemBlocks::default()
    }

    fn check_segment(&self, address: u64, len: usize) {
        if let Some(segment) = self.segment_bytes {
            assert!(
                address % segment + len as u64 <= segment,
                "an access straddles two segments"
            );
        }
    }
}

/// The switches and counters of the unit tests (none of them under shuttle).
#[cfg(all(test, not(feature = "shuttle")))]
impl MemBlocks {
    /// A device of segments of `segment_bytes` (a multiple of [`IO_ALIGN_BYTES`]): an
    /// access straddling two is a bug (asserted), and `file_of` names a segment as
    /// `mem-<segment as 8 hex digits>`.
    pub(crate) fn with_segments(segment_bytes: u64) -> MemBlocks {
        assert!(segment_bytes > 0 && segment_bytes.is_multiple_of(IO_ALIGN_BYTES));
        MemBlocks {
            segment_bytes: Some(segment_bytes),
            ..MemBlocks::default()
        }
    }

    /// (bytes written, bytes read) so far.
    pub(crate) fn io_bytes(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.written_bytes, s.read_bytes)
    }

    /// Makes every later write fail.
    pub(crate) fn fail_writes(&self) {
        self.state.lock().fail_writes = true;
    }

    /// Makes the next `reads` reads fail.
    pub(crate) fn fail_reads(&self, reads: u64) {
        self.state.lock().fail_reads = reads;
    }

    /// Blocks holding bytes (written and not discarded or truncated).
    pub(crate) fn block_count(&self) -> usize {
        self.state.lock().blocks.len()
    }

    /// Flips bit `bit` of the byte at `address`, as damage on a disk would; false if
    /// nothing was written there.
    pub(crate) fn flip_bit(&self, address: u64, bit: u32) -> bool {
        let mut s = self.state.lock();
        let block = address - address % IO_ALIGN_BYTES;
        match s.blocks.get_mut(&block) {
            Some(bytes) => {
                bytes[(address - block) as usize] ^= 1 << (bit % 8);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
impl BlockDevice for MemBlocks {
    fn write(&self, address: u64, bytes: &[u8]) -> io::Result<()> {
        check_aligned(address, bytes.len(), IO_ALIGN_BYTES);
        self.check_segment(address, bytes.len());
        let mut s = self.state.lock();
        if s.fail_writes {
            return Err(io::Error::other("simulated EIO on a block write"));
        }
        for (i, chunk) in bytes.chunks(IO_ALIGN_BYTES as usize).enumerate() {
            s.blocks
                .insert(address + i as u64 * IO_ALIGN_BYTES, chunk.into());
        }
        s.written_bytes += bytes.len() as u64;
        Ok(())
    }

    fn read(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        check_aligned(address, buf.len(), SECTOR);
        self.check_segment(address, buf.len());
        let mut s = self.state.lock();
        if address < s.truncated_before {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("read at {address}, below the truncation point"),
            ));
        }
        if s.fail_reads > 0 {
            s.fail_reads -= 1;
            return Err(io::Error::other("simulated EIO on a block read"));
        }
        // Sector-aligned: a read may start and end inside a block.
        let mut done = 0;
        while done < buf.len() {
            let at = address + done as u64;
            let block = at - at % IO_ALIGN_BYTES;
            let from = (at - block) as usize;
            let n = (IO_ALIGN_BYTES as usize - from).min(buf.len() - done);
            match s.blocks.get(&block) {
                Some(bytes) => buf[done..done + n].copy_from_slice(&bytes[from..from + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
        s.read_bytes += buf.len() as u64;
        Ok(())
    }

    fn read_align(&self) -> u64 {
        SECTOR
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    fn truncate_before(&self, address: u64) -> io::Result<()> {
        // Whole blocks only: the block holding `address` keeps the records above it.
        let address = address - address % IO_ALIGN_BYTES;
        let mut s = self.state.lock();
        s.blocks.retain(|&a, _| a >= address);
        s.truncated_before = s.truncated_before.max(address);
        Ok(())
    }

    fn file_of(&self, address: u64) -> Option<PathBuf> {
        self.segment_bytes
            .map(|segment| PathBuf::from(format!("mem-{:08x}", address / segment)))
    }

    fn segment_bytes(&self) -> Option<u64> {
        self.segment_bytes
    }

    fn discard(&self, address: u64, len: u64) -> io::Result<()> {
        check_aligned(address, 0, IO_ALIGN_BYTES);
        assert!(
            len.is_multiple_of(IO_ALIGN_BYTES),
            "unaligned discard of {len} bytes"
        );
        self.state
            .lock()
            .blocks
            .retain(|&a, _| a < address || a >= address + len);
        Ok(())
    }

    fn truncate_from(&self, end: u64) -> io::Result<()> {
        check_aligned(end, 0, IO_ALIGN_BYTES);
        self.state.lock().blocks.retain(|&a, _| a < end);
        Ok(())
    }
}

/// Zeroed heap bytes aligned to [`IO_ALIGN_BYTES`], as `O_DIRECT` IO needs.
///
/// A buffer of [`OWN_MAPPING_BYTES`] or more is a mapping of its own, given back to the
/// operating system when dropped. Through the allocator, the large buffers that
/// a hash log's compaction and recovery take and drop page after page (up to 4 MiB each) stayed in
/// the allocator's per-thread arenas once it had raised its threshold for mapping
/// blocks of their own (glibc raises it to the largest block freed): at 5M records in
/// 52 MiB and 16 threads the process peaked at 133 MiB, 88 MiB with these mappings.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

/// The size from which an [`AlignedBuf`] is a mapping of its own.
pub(crate) const OWN_MAPPING_BYTES: usize = 64 << 10;

impl AlignedBuf {
    /// `bytes` zeroed bytes (more than zero).
    pub(crate) fn new(bytes: usize) -> AlignedBuf {
        let layout = Layout::from_size_align(bytes, IO_ALIGN_BYTES as usize)
            .expect("a buffer size below isize::MAX");
        let ptr = if bytes >= OWN_MAPPING_BYTES {
            // SAFETY: an anonymous private mapping with a null hint touches no existing
            // memory; it is zero-filled and page-aligned (at least IO_ALIGN_BYTES).
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                std::alloc::handle_alloc_error(layout)
            }
            p.cast::<u8>()
        } else {
            // SAFETY: the layout has a non-zero size.
            unsafe { alloc_zeroed(layout) }
        };
        AlignedBuf {
            ptr: NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout)),
            layout,
        }
    }

    /// The bytes, mutably.
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: an allocation of `layout.size()` bytes owned by `self`, zeroed at birth.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }

    /// The bytes.
    pub(crate) fn as_ref(&self) -> &[u8] {
        // SAFETY: as for `as_mut`, shared.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

// SAFETY: an owned heap buffer, like a `Box<[u8]>`: no aliasing, no thread affinity.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; `&AlignedBuf` gives only shared access to the bytes.
unsafe impl Sync for AlignedBuf {}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.layout.size() >= OWN_MAPPING_BYTES {
            // SAFETY: mapped in `new` with this length, unmapped once; nothing borrows
            // it past `self`.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.layout.size()) };
        } else {
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
        }
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    #[test]
    fn sector_reads_return_the_bytes_written_directly_or_through_whole_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..3 * 4096usize)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        for direct in [false, true] {
            let pages =
                SegmentFiles::new(dir.path(), (&format!("t{direct}"), "blk"), 1 << 20, direct);
            // Written from an aligned buffer, as O_DIRECT wants.
            let mut source = AlignedBuf::new(bytes.len());
            source.as_mut().copy_from_slice(&bytes);
            pages.write(8192, source.as_mut()).unwrap();
            for (at, len) in [(0, 512), (512, 1024), (3584, 1024), (2 * 4096 + 3584, 512)] {
                let mut read = AlignedBuf::new(len);
                pages.read(8192 + at, read.as_mut()).unwrap();
                assert_eq!(read.as_mut(), &bytes[at as usize..][..len], "{direct} {at}");
                let mut bounced = AlignedBuf::new(len);
                pages
                    .read_through_blocks(8192 + at, bounced.as_mut())
                    .unwrap();
                assert_eq!(bounced.as_mut(), read.as_mut(), "{direct} {at}");
            }
            // Never written: zeros.
            let mut read = AlignedBuf::new(512);
            pages.read(64 * 4096 + 512, read.as_mut()).unwrap();
            assert!(read.as_mut().iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn segment_files_discard_punches_holes_and_truncate_from_removes_and_cuts_files() {
        let dir = tempfile::tempdir().unwrap();
        let segment = 64 << 10;
        let files = SegmentFiles::new(dir.path(), ("v", "blk"), segment, false);
        let mut block = AlignedBuf::new(4096);
        // Four segments, each block stamped with its address.
        for at in (0..4 * segment).step_by(4096) {
            block.as_mut().fill((at / 4096) as u8 | 1);
            files.write(at, block.as_ref()).unwrap();
        }
        files.sync().unwrap();
        let read = |at: u64| {
            let mut buf = AlignedBuf::new(4096);
            files.read(at, buf.as_mut()).map(|()| buf.as_ref()[0])
        };
        // A hole across a segment boundary reads as zeros; its neighbours stay.
        files.discard(segment - 8192, 16384).unwrap();
        for (at, zero) in [(segment - 12288, false), (segment - 8192, true)]
            .into_iter()
            .chain([(segment + 4096, true), (segment + 8192, false)])
        {
            let expected = if zero { 0 } else { (at / 4096) as u8 | 1 };
            assert_eq!(read(at).unwrap(), expected, "{at}");
        }
        // A discard where no file is: nothing to give back.
        files.discard(9 * segment, 4096).unwrap();
        // The end inside segment 1: segments 2 and 3 go, segment 1 is cut short.
        files.truncate_from(segment + 3 * 4096).unwrap();
        let names = |dir: &Path| {
            let mut n: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            n.sort();
            n
        };
        assert_eq!(names(dir.path()), ["v-00000000.blk", "v-00000001.blk"]);
        let len = |n: &str| std::fs::metadata(dir.path().join(n)).unwrap().len();
        assert_eq!(len("v-00000001.blk"), 3 * 4096);
        assert_eq!(read(segment + 4096).unwrap(), 0); // punched earlier
        assert_eq!(
            read(segment + 2 * 4096).unwrap(),
            (segment / 4096 + 2) as u8 | 1
        );
        assert_eq!(
            read(segment - 12288).unwrap(),
            ((segment - 12288) / 4096) as u8 | 1
        );
        // Written again above the old end: files come back, and a later open of the
        // same files (which lists the directory) removes them at a segment boundary.
        files.write(3 * segment, block.as_ref()).unwrap();
        files.sync().unwrap();
        let again = SegmentFiles::new(dir.path(), ("v", "blk"), segment, false);
        again.truncate_from(segment).unwrap();
        assert_eq!(names(dir.path()), ["v-00000000.blk"]);
    }

    #[test]
    fn aligned_bufs_small_and_mapped_are_zeroed_aligned_and_writable() {
        for bytes in [
            512,
            4096,
            OWN_MAPPING_BYTES - 4096,
            OWN_MAPPING_BYTES,
            4 << 20,
        ] {
            for round in 0..3u8 {
                let mut page = AlignedBuf::new(bytes);
                assert_eq!(page.as_ref().len(), bytes);
                assert!(
                    page.as_ref().iter().all(|&b| b == 0),
                    "{bytes} round {round}"
                );
                assert_eq!(page.as_ref().as_ptr() as usize % IO_ALIGN_BYTES as usize, 0);
                // Dirty it: a buffer handed out again must still come back zeroed.
                page.as_mut().fill(round + 1);
                assert!(page.as_ref().iter().all(|&b| b == round + 1));
            }
        }
    }
}
