//! Where a hybrid log's pages go when they leave memory: a device addressed by the log's
//! own logical addresses (FASTER, section 5.1: one address space over memory and disk).
//!
//! A [`LogPages`] device stores whole log pages at their logical address and reads any
//! aligned range back; [`LogPages::truncate_before`] gives up everything below an
//! address (the log's BEGIN moved past it). [`FilePages`] keeps the address space in
//! segment files of a fixed size (`<prefix>-<segment as 8 hex digits>.hlog`), so that a
//! truncation deletes whole files; [`MemPages`] keeps it in memory for tests.
//!
//! Invariants this module owns:
//! - A page is written whole, at an address that is a multiple of its size, and a
//!   segment holds a whole number of pages: no page straddles two files.
//! - Writes are [`IO_ALIGN_BYTES`]-aligned in offset and length. Reads are aligned to
//!   the device's [`LogPages::read_align`]: [`SECTOR_BYTES`] for segment files, so a
//!   record read from disk costs a sector or two, not a 4 KiB block. Where O_DIRECT
//!   refuses sector-aligned reads (a device of 4 KiB logical blocks), the files fall
//!   back to 4 KiB-aligned reads through a bounce buffer, once and for good.
//! - Nothing is read below the truncation point: such a read is an error, never stale
//!   bytes of a deleted segment.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::sync::Mutex;

/// The alignment of every device write, in offset and length, and of reads on devices
/// that allow nothing smaller.
pub(crate) const IO_ALIGN_BYTES: u64 = 4096;
/// The smallest read alignment a device may allow (a disk sector).
pub(crate) const SECTOR_BYTES: u64 = 512;

/// A hybrid log's disk, addressed by logical address.
pub(crate) trait LogPages: Send + Sync {
    /// Writes `bytes` (one or more whole pages) at `address`. Both are aligned.
    fn write(&self, address: u64, bytes: &[u8]) -> io::Result<()>;
    /// Reads `buf.len()` bytes at `address` (both aligned to [`LogPages::read_align`], and
    /// `buf` in memory to [`IO_ALIGN_BYTES`]). Bytes never written read as zeros; bytes
    /// below the truncation point are an error.
    fn read(&self, address: u64, buf: &mut [u8]) -> io::Result<()>;
    /// The alignment reads need, in offset and length.
    fn read_align(&self) -> u64 {
        IO_ALIGN_BYTES
    }
    /// Where a read of `len` bytes at `address` (aligned as for [`LogPages::read`]) can
    /// be submitted by the caller, as an offset into an open file, so that many reads
    /// go to the device at once (io_uring); `None` if the caller must use
    /// [`LogPages::read`]. The file stays readable as long as the caller holds it,
    /// whatever truncations happen meanwhile (its bytes at the offset do not change).
    fn read_target(&self, _address: u64, _len: usize) -> Option<(Arc<File>, u64)> {
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
}

/// Segment files in a directory.
pub(crate) struct FilePages {
    dir: PathBuf,
    prefix: String,
    segment_bytes: u64,
    direct: bool,
    /// [`SECTOR_BYTES`], until O_DIRECT refuses a read that small.
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
}

impl FilePages {
    /// Segment files `<dir>/<prefix>-<n>.hlog` of `segment_bytes` each (a multiple of
    /// [`IO_ALIGN_BYTES`]), opened with `O_DIRECT` if `direct`.
    pub(crate) fn new(dir: &Path, prefix: &str, segment_bytes: u64, direct: bool) -> FilePages {
        assert!(segment_bytes > 0 && segment_bytes.is_multiple_of(IO_ALIGN_BYTES));
        FilePages {
            dir: dir.to_path_buf(),
            prefix: prefix.to_string(),
            segment_bytes,
            direct,
            read_align: std::sync::atomic::AtomicU64::new(SECTOR_BYTES),
            state: Mutex::new(FileState::default()),
        }
    }

    fn path(&self, segment: u64) -> PathBuf {
        self.dir.join(format!("{}-{segment:08x}.hlog", self.prefix))
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
            if self.direct {
                use std::os::unix::fs::OpenOptionsExt;
                options.custom_flags(libc::O_DIRECT);
            }
            let path = self.path(segment);
            let file = match options.open(&path) {
                // A filesystem that refuses O_DIRECT (tmpfs) gets buffered IO.
                Err(e) if self.direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    let mut buffered = OpenOptions::new();
                    buffered.read(true).write(true).create(create);
                    buffered.open(&path)
                }
                other => other,
            }
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            slot.insert(Arc::new(file));
        }
        if create && !state.dirty.contains(&segment) {
            state.dirty.push(segment);
        }
        Ok(Arc::clone(&state.open[&segment]))
    }

    /// Reads `buf` at `address` from its segment; past the end of what was written
    /// reads zeros, as in a sparse file.
    fn read_exact_at(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        let (segment, offset) = self.split(address, buf.len());
        self.with_file(segment, false, |f| {
            let mut done = 0;
            while done < buf.len() {
                let n = f.read_at(&mut buf[done..], offset + done as u64)?;
                if n == 0 {
                    buf[done..].fill(0);
                    break;
                }
                done += n;
            }
            Ok(())
        })
    }

    /// Reads `buf` at `address` through a buffer of the whole 4 KiB blocks around it.
    fn read_through_blocks(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        let start = address - address % IO_ALIGN_BYTES;
        let end = (address + buf.len() as u64).div_ceil(IO_ALIGN_BYTES) * IO_ALIGN_BYTES;
        let mut blocks = super::hlog::AlignedPage::new((end - start) as usize);
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

fn check_aligned(address: u64, len: usize, align: u64) {
    assert!(
        address.is_multiple_of(align) && (len as u64).is_multiple_of(align),
        "unaligned log IO at {address} of {len} bytes"
    );
}

impl LogPages for FilePages {
    fn write(&self, address: u64, bytes: &[u8]) -> io::Result<()> {
        check_aligned(address, bytes.len(), IO_ALIGN_BYTES);
        let (segment, offset) = self.split(address, bytes.len());
        self.with_file(segment, true, |f| f.write_all_at(bytes, offset))
    }

    fn read(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        check_aligned(address, buf.len(), SECTOR_BYTES);
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
    /// it among them) is for the caller to repeat with [`LogPages::read`].
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

    fn file_of(&self, address: u64) -> Option<PathBuf> {
        Some(self.path(address / self.segment_bytes))
    }

    fn sync(&self) -> io::Result<()> {
        let files: Vec<(u64, Arc<File>)> = {
            let mut state = self.state.lock();
            let dirty = std::mem::take(&mut state.dirty);
            dirty
                .into_iter()
                .filter_map(|s| state.open.get(&s).map(|f| (s, Arc::clone(f))))
                .collect()
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
                return Err(e);
            }
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
}

impl LogPages for crate::storage::SimBlocks {
    fn write(&self, address: u64, bytes: &[u8]) -> io::Result<()> {
        crate::storage::SimBlocks::write(self, address, bytes)
    }

    fn read(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        crate::storage::SimBlocks::read(self, address, buf)
    }

    fn sync(&self) -> io::Result<()> {
        crate::storage::SimBlocks::sync(self)
    }

    fn truncate_before(&self, address: u64) -> io::Result<()> {
        self.discard_below(address);
        Ok(())
    }
}

/// A device whose truncations stop at a floor: the part of the log that a checkpoint
/// still kept needs stays on the device until that checkpoint is retired (a log's BEGIN
/// may move past it meanwhile; nothing reads below BEGIN).
pub(crate) struct Retaining {
    inner: Arc<dyn LogPages>,
    /// (the highest truncation asked for, the floor).
    state: Mutex<(u64, u64)>,
}

impl Retaining {
    /// `inner`, keeping everything from `floor` up (0 keeps everything).
    pub(crate) fn new(inner: Arc<dyn LogPages>, floor: u64) -> Retaining {
        Retaining {
            inner,
            state: Mutex::new((0, floor)),
        }
    }

    /// Bytes the floor keeps below `begin` (the log's BEGIN) that a truncation asked
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

impl LogPages for Retaining {
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
}

/// A device in memory, page by page, for tests; counts its IO.
#[derive(Default)]
pub(crate) struct MemPages {
    state: Mutex<MemState>,
}

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

impl MemPages {
    pub(crate) fn new() -> MemPages {
        MemPages::default()
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

    /// Flips bit `bit` of the byte at `address`, as damage on a disk would; false if
    /// nothing was written there.
    #[cfg(test)]
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

impl LogPages for MemPages {
    fn write(&self, address: u64, bytes: &[u8]) -> io::Result<()> {
        check_aligned(address, bytes.len(), IO_ALIGN_BYTES);
        let mut s = self.state.lock();
        if s.fail_writes {
            return Err(io::Error::other("simulated EIO on a log page write"));
        }
        for (i, chunk) in bytes.chunks(IO_ALIGN_BYTES as usize).enumerate() {
            s.blocks
                .insert(address + i as u64 * IO_ALIGN_BYTES, chunk.into());
        }
        s.written_bytes += bytes.len() as u64;
        Ok(())
    }

    fn read(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        check_aligned(address, buf.len(), SECTOR_BYTES);
        let mut s = self.state.lock();
        if address < s.truncated_before {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("read at {address}, below the truncation point"),
            ));
        }
        if s.fail_reads > 0 {
            s.fail_reads -= 1;
            return Err(io::Error::other("simulated EIO on a log read"));
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
        SECTOR_BYTES
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
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::super::hlog::AlignedPage;
    use super::*;

    #[test]
    fn sector_reads_return_the_bytes_written_directly_or_through_whole_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..3 * 4096usize)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        for direct in [false, true] {
            let pages = FilePages::new(dir.path(), &format!("t{direct}"), 1 << 20, direct);
            // Written from an aligned buffer, as O_DIRECT wants.
            let mut source = AlignedPage::new(bytes.len());
            source.as_mut().copy_from_slice(&bytes);
            pages.write(8192, source.as_mut()).unwrap();
            for (at, len) in [(0, 512), (512, 1024), (3584, 1024), (2 * 4096 + 3584, 512)] {
                let mut read = AlignedPage::new(len);
                pages.read(8192 + at, read.as_mut()).unwrap();
                assert_eq!(read.as_mut(), &bytes[at as usize..][..len], "{direct} {at}");
                let mut bounced = AlignedPage::new(len);
                pages
                    .read_through_blocks(8192 + at, bounced.as_mut())
                    .unwrap();
                assert_eq!(bounced.as_mut(), read.as_mut(), "{direct} {at}");
            }
            // Never written: zeros.
            let mut read = AlignedPage::new(512);
            pages.read(64 * 4096 + 512, read.as_mut()).unwrap();
            assert!(read.as_mut().iter().all(|&b| b == 0));
        }
    }
}
