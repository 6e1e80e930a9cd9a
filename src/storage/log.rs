//! Log devices: where the write-ahead log's segments live, as numbered append-only
//! files of whole 4 KiB blocks. The storage layer moves the bytes and knows nothing of
//! what a block means (the `wal` module owns the block and record formats).
//!
//! Two devices: [`DirLog`], a directory of preallocated segment files read and written
//! with `pread`/`pwrite` and made durable with `fdatasync`; and [`SimLog`], a seeded
//! in-memory device for crash tests that keeps live and durable bytes apart and, on
//! [`SimLog::crash`], loses, keeps or tears (by 512-byte sector) every write since the
//! segment's last sync.
//!
//! Besides segments a device may keep *spares*: files of the same kind, outside the log
//! (never listed by [`LogDevice::list`], never read by recovery), kept to become later
//! segments. A spare is a retired segment renamed ([`LogDevice::retire`]) or a file
//! zero-filled ahead of need ([`LogDevice::create_spare`]); either way every block of it
//! has been written, so the writes and `fdatasync`s of the segment it becomes change no
//! file system metadata. [`LogDevice::reuse`] renames a spare into a segment.
//!
//! Invariants: a write covers whole blocks at a block-aligned offset; a segment's bytes
//! written before a successful [`LogDevice::sync`] of that segment are durable; a rename
//! between segment and spare is durable when its call returns (a crash during it leaves
//! the file under one name or the other, with its bytes); after a failed write or sync
//! the device refuses further writes (poisoned), since Linux may drop dirty pages after
//! reporting a writeback error.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::SECTOR_BYTES;
use super::blocks::read_up_to;
use super::file::name_path;
use super::sim::{Faults, SimFault, SimOp};
use crate::sync::Mutex;
use crate::sync::atomic::{AtomicBool, Ordering};

/// Bytes in one log block: the unit of every log write.
pub const LOG_BLOCK_BYTES: usize = 4096;

/// Where the write-ahead log's segments live. Segments are named by a `u64` id that is
/// never reused; spares (see the module docs) by a `u64` id of the same space, which no
/// later segment takes (the log sees to both).
///
/// The spare methods have defaults for a device without spares: it lists none, and
/// refuses the rest with [`io::ErrorKind::Unsupported`], so the log removes retired
/// segments and creates every segment afresh.
pub trait LogDevice: Send + Sync {
    /// Creates segment `id`, `len_bytes` long (a multiple of [`LOG_BLOCK_BYTES`]) and
    /// zeroed, replacing nothing: an existing segment of that id is an error.
    fn create(&self, id: u64, len_bytes: u64) -> io::Result<()>;

    /// Writes `buf` (whole blocks) at `offset` (block-aligned) of segment `id`.
    fn write_at(&self, id: u64, offset: u64, buf: &[u8]) -> io::Result<()>;

    /// Reads up to `buf.len()` bytes at `offset` of segment `id`; returns how many were
    /// read (fewer only at the segment's end).
    fn read_at(&self, id: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize>;

    /// Makes every write to segment `id` so far durable.
    fn sync(&self, id: u64) -> io::Result<()>;

    /// Removes segment `id`.
    fn remove(&self, id: u64) -> io::Result<()>;

    /// The ids of the segments present, ascending.
    fn list(&self) -> io::Result<Vec<u64>>;

    /// The spares present, ascending by id, with their lengths in bytes.
    fn spares(&self) -> io::Result<Vec<(u64, u64)>> {
        Ok(Vec::new())
    }

    /// Creates spare `id`, `len_bytes` long, every byte of it written (zeros) and
    /// durable, and its name durable. A crash during the call may leave it shorter, or
    /// with blocks not written: the log checks a spare's length before using it, and a
    /// block not written reads as zeros (only slower to write).
    fn create_spare(&self, id: u64, len_bytes: u64) -> io::Result<()> {
        let _ = (id, len_bytes);
        Err(no_spares())
    }

    /// Turns segment `id` into spare `id`, bytes and all; durable when it returns.
    fn retire(&self, id: u64) -> io::Result<()> {
        let _ = id;
        Err(no_spares())
    }

    /// Turns spare `spare` into segment `id` (which must not exist), bytes and all;
    /// durable when it returns.
    fn reuse(&self, spare: u64, id: u64) -> io::Result<()> {
        let _ = (spare, id);
        Err(no_spares())
    }

    /// Removes spare `id`.
    fn remove_spare(&self, id: u64) -> io::Result<()> {
        let _ = id;
        Err(no_spares())
    }
}

/// What a device without spares answers.
fn no_spares() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "this log device keeps no spare segments",
    )
}

/// Refuses writes once a write or sync failed.
fn poisoned() -> io::Error {
    io::Error::other("the log device refuses writes after a failed write or sync")
}

/// A directory of segment files, `wal-<id as 16 hex digits>.log`, and spares,
/// `wal-<id as 16 hex digits>.spare`.
#[derive(Debug)]
pub struct DirLog {
    dir: PathBuf,
    files: Mutex<BTreeMap<u64, std::sync::Arc<File>>>,
    failed: AtomicBool,
}

impl DirLog {
    /// The log device in `dir`, which must exist.
    pub fn open(dir: impl AsRef<Path>) -> io::Result<DirLog> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: not a directory", dir.display()),
            ));
        }
        Ok(DirLog {
            dir,
            files: Mutex::new(BTreeMap::new()),
            failed: AtomicBool::new(false),
        })
    }

    fn path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("wal-{id:016x}.log"))
    }

    fn spare_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("wal-{id:016x}.spare"))
    }

    /// Makes the directory's entries durable (a creation, rename or removal).
    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| named(&self.dir, e))
    }

    /// The ids of the files named `wal-<16 hex digits><suffix>`, ascending.
    fn ids_with_suffix(&self, suffix: &str) -> io::Result<Vec<u64>> {
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| named(&self.dir, e))? {
            let name = entry.map_err(|e| named(&self.dir, e))?.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(hex) = name
                .strip_prefix("wal-")
                .and_then(|n| n.strip_suffix(suffix))
                && hex.len() == 16
                && let Ok(id) = u64::from_str_radix(hex, 16)
            {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// The open file of segment `id`.
    fn file(&self, id: u64) -> io::Result<std::sync::Arc<File>> {
        let mut files = self.files.lock();
        if let Some(f) = files.get(&id) {
            return Ok(std::sync::Arc::clone(f));
        }
        let path = self.path(id);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| named(&path, e))?;
        let f = std::sync::Arc::new(f);
        files.insert(id, std::sync::Arc::clone(&f));
        Ok(f)
    }

    /// Records a failed write or sync: the device is poisoned.
    fn fail(&self, path: &Path, e: io::Error) -> io::Error {
        self.failed.store(true, Ordering::Release);
        named(path, e)
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.failed.load(Ordering::Acquire) {
            Err(poisoned())
        } else {
            Ok(())
        }
    }
}

/// `e` naming `path`, as the file store's errors do (`PathIoError`, kind kept).
fn named(path: &Path, e: io::Error) -> io::Error {
    name_path(Some(path), e)
}

impl LogDevice for DirLog {
    fn create(&self, id: u64, len_bytes: u64) -> io::Result<()> {
        self.check_writable()?;
        let path = self.path(id);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| named(&path, e))?;
        // Preallocate, so that appends do not change the file's size and a full disk
        // shows at creation, not mid-commit. (On ext4 and xfs the first write to each
        // preallocated extent still changes metadata, so an fdatasync after it commits
        // the journal too: the log prefers spares, whose blocks are all written.)
        let len = i64::try_from(len_bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "log segment too large"))?;
        // SAFETY: `f` is an open file descriptor for the duration of the call.
        match unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, len) } {
            0 => {}
            // A filesystem without fallocate: a sparse file of the full length.
            libc::EOPNOTSUPP | libc::EINVAL => f.set_len(len_bytes).map_err(|e| named(&path, e))?,
            err => return Err(named(&path, io::Error::from_raw_os_error(err))),
        }
        f.sync_all().map_err(|e| named(&path, e))?;
        self.sync_dir()?;
        self.files.lock().insert(id, std::sync::Arc::new(f));
        Ok(())
    }

    fn write_at(&self, id: u64, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.check_writable()?;
        debug_assert!(buf.len().is_multiple_of(LOG_BLOCK_BYTES));
        debug_assert!(offset.is_multiple_of(LOG_BLOCK_BYTES as u64));
        let f = self.file(id)?;
        f.write_all_at(buf, offset)
            .map_err(|e| self.fail(&self.path(id), e))
    }

    fn read_at(&self, id: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let f = self.file(id)?;
        read_up_to(&f, offset, buf).map_err(|e| named(&self.path(id), e))
    }

    fn sync(&self, id: u64) -> io::Result<()> {
        self.check_writable()?;
        let f = self.file(id)?;
        f.sync_data().map_err(|e| self.fail(&self.path(id), e))
    }

    fn remove(&self, id: u64) -> io::Result<()> {
        self.files.lock().remove(&id);
        let path = self.path(id);
        std::fs::remove_file(&path).map_err(|e| named(&path, e))
    }

    fn list(&self) -> io::Result<Vec<u64>> {
        self.ids_with_suffix(".log")
    }

    fn spares(&self) -> io::Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        for id in self.ids_with_suffix(".spare")? {
            let path = self.spare_path(id);
            let len = std::fs::metadata(&path).map_err(|e| named(&path, e))?.len();
            out.push((id, len));
        }
        Ok(out)
    }

    fn create_spare(&self, id: u64, len_bytes: u64) -> io::Result<()> {
        self.check_writable()?;
        let path = self.spare_path(id);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| named(&path, e))?;
        // Written, not only allocated: zeros over the whole length, in large writes.
        // A block of zeros never validates as a log block.
        let zeros = vec![0u8; 1 << 20];
        let mut at = 0u64;
        let filled = (|| {
            while at < len_bytes {
                let n = (len_bytes - at).min(zeros.len() as u64) as usize;
                f.write_all_at(&zeros[..n], at)?;
                at += n as u64;
            }
            f.sync_all()
        })();
        if let Err(e) = filled.and_then(|()| self.sync_dir()) {
            // Nothing refers to a spare yet: a failed one is removed, and the device
            // stays writable (the log's own bytes are untouched).
            let _ = std::fs::remove_file(&path);
            return Err(named(&path, e));
        }
        Ok(())
    }

    fn retire(&self, id: u64) -> io::Result<()> {
        self.check_writable()?;
        self.files.lock().remove(&id);
        let (from, to) = (self.path(id), self.spare_path(id));
        std::fs::rename(&from, &to).map_err(|e| named(&from, e))?;
        self.sync_dir()
    }

    fn reuse(&self, spare: u64, id: u64) -> io::Result<()> {
        self.check_writable()?;
        let (from, to) = (self.spare_path(spare), self.path(id));
        // `rename` would replace a segment of that id; the log never asks for one that
        // exists, and a check here keeps a bug from destroying log records.
        if to.exists() {
            return Err(named(
                &to,
                io::Error::new(io::ErrorKind::AlreadyExists, "log segment exists"),
            ));
        }
        std::fs::rename(&from, &to).map_err(|e| named(&from, e))?;
        // The segment's records must not vanish with its name after a crash.
        self.sync_dir().map_err(|e| self.fail(&self.dir, e))
    }

    fn remove_spare(&self, id: u64) -> io::Result<()> {
        let path = self.spare_path(id);
        std::fs::remove_file(&path).map_err(|e| named(&path, e))
    }
}

/// One simulated segment: what reads see, what survived the last sync, and the writes
/// since (offset and length), in order.
#[derive(Clone, Debug, Default)]
struct SimSegment {
    live: Vec<u8>,
    durable: Vec<u8>,
}

/// A seeded, in-memory log device for crash tests (see the module docs). Its renames
/// between segments and spares are atomic and durable at once (a directory log's
/// `rename` and directory sync, which a crash leaves done or not done).
#[derive(Debug)]
pub struct SimLog {
    segments: Mutex<BTreeMap<u64, SimSegment>>,
    spares: Mutex<BTreeMap<u64, SimSegment>>,
    seed: Mutex<u64>,
    /// The armed faults of reads, writes and syncs.
    faults: Mutex<Faults>,
    /// Operations failed by an armed fault.
    injected: crate::sync::atomic::AtomicU64,
    failed: AtomicBool,
}

impl SimLog {
    /// An empty device whose crashes are decided by `seed`.
    pub fn new(seed: u64) -> SimLog {
        SimLog {
            segments: Mutex::new(BTreeMap::new()),
            spares: Mutex::new(BTreeMap::new()),
            seed: Mutex::new(mix(seed) | 1),
            faults: Mutex::new(Faults::default()),
            injected: crate::sync::atomic::AtomicU64::new(0),
            failed: AtomicBool::new(false),
        }
    }

    /// The next pseudo-random number (xorshift).
    fn next_random(&self) -> u64 {
        let mut s = self.seed.lock();
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    /// The sync after the next `n` syncs fails with `EIO` (and poisons the device).
    pub fn fail_syncs_after(&self, n: u64) {
        self.arm(SimOp::Sync, n, SimFault::Permanent);
    }

    /// Arms `fault` on the `op` after the next `n` of the device's segment reads, writes
    /// or syncs (see [`SimFault`]; replacing what was armed on `op`). A failed write or
    /// sync poisons the device, as it does a [`DirLog`]; a failed read changes nothing.
    /// Creating, renaming and removing files never fail.
    #[doc(hidden)]
    pub fn arm(&self, op: SimOp, n: u64, fault: SimFault) {
        self.faults.lock().arm(op, n, fault);
    }

    /// Operations failed by an armed fault so far.
    pub fn injected_failures(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Disarms every fault. Does not lift poisoning: a restarted process
    /// ([`SimLog::crash`]) finds a writable device.
    pub fn clear_faults(&self) {
        *self.faults.lock() = Faults::default();
    }

    /// The error of an armed fault that fires on this `op`, which poisons the device
    /// unless it is a read.
    fn injected(&self, op: SimOp, what: impl FnOnce() -> String) -> io::Result<()> {
        match self.faults.lock().tick(op, what) {
            None => Ok(()),
            Some(e) => {
                self.injected.fetch_add(1, Ordering::Relaxed);
                if op != SimOp::Read {
                    self.failed.store(true, Ordering::Release);
                }
                Err(e)
            }
        }
    }

    /// The device a restarted process would find: per segment, every 512-byte sector
    /// written since its last sync is, by the seeded coin, lost or kept, so a block may
    /// come back torn. Nothing is poisoned on the new device.
    pub fn crash(&self) -> SimLog {
        // Both maps at once, so a rename between them is seen done or not done.
        let (segments, spares) = {
            let segments = self.segments.lock();
            let spares = self.spares.lock();
            (segments.clone(), spares.clone())
        };
        SimLog {
            segments: Mutex::new(self.crash_files(segments)),
            spares: Mutex::new(self.crash_files(spares)),
            seed: Mutex::new(self.next_random() | 1),
            faults: Mutex::new(Faults::default()),
            injected: crate::sync::atomic::AtomicU64::new(0),
            failed: AtomicBool::new(false),
        }
    }

    /// The files as a crash leaves them: each sector written since the last sync lost or
    /// kept by the seeded coin.
    fn crash_files(&self, files: BTreeMap<u64, SimSegment>) -> BTreeMap<u64, SimSegment> {
        let mut after = BTreeMap::new();
        for (id, seg) in files {
            let mut bytes = seg.durable.clone();
            for (i, chunk) in seg.live.chunks(SECTOR_BYTES).enumerate() {
                let at = i * SECTOR_BYTES;
                if bytes.get(at..at + chunk.len()) != Some(chunk)
                    && self.next_random().is_multiple_of(2)
                {
                    bytes[at..at + chunk.len()].copy_from_slice(chunk);
                }
            }
            after.insert(
                id,
                SimSegment {
                    live: bytes.clone(),
                    durable: bytes,
                },
            );
        }
        after
    }

    /// Flips one bit of segment `id`'s bytes, live and durable, as media rot would.
    pub fn flip_bit(&self, id: u64, bit: u64) -> bool {
        let mut segments = self.segments.lock();
        let Some(seg) = segments.get_mut(&id) else {
            return false;
        };
        let (byte, mask) = ((bit / 8) as usize, 1u8 << (bit % 8));
        if byte >= seg.live.len() {
            return false;
        }
        seg.live[byte] ^= mask;
        seg.durable[byte] ^= mask;
        true
    }

    /// Overwrites bytes of segment `id`, live and durable (a test's hand-made damage).
    pub fn overwrite(&self, id: u64, offset: usize, bytes: &[u8]) {
        let mut segments = self.segments.lock();
        let seg = segments.get_mut(&id).expect("segment exists");
        seg.live[offset..offset + bytes.len()].copy_from_slice(bytes);
        seg.durable[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.failed.load(Ordering::Acquire) {
            Err(poisoned())
        } else {
            Ok(())
        }
    }
}

/// Spreads a small seed over all 64 bits (splitmix64's finaliser), so that the first
/// coins of nearby seeds are not biased the same way.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn no_segment(id: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("log segment {id} does not exist"),
    )
}

impl LogDevice for SimLog {
    fn create(&self, id: u64, len_bytes: u64) -> io::Result<()> {
        self.check_writable()?;
        let mut segments = self.segments.lock();
        if segments.contains_key(&id) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("log segment {id} exists"),
            ));
        }
        let zero = vec![0u8; len_bytes as usize];
        segments.insert(
            id,
            SimSegment {
                live: zero.clone(),
                durable: zero,
            },
        );
        Ok(())
    }

    fn write_at(&self, id: u64, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.check_writable()?;
        self.injected(SimOp::Write, || {
            format!("a write at {offset} of simulated log segment {id}")
        })?;
        let mut segments = self.segments.lock();
        let seg = segments.get_mut(&id).ok_or_else(|| no_segment(id))?;
        let at = offset as usize;
        let end = at + buf.len();
        if end > seg.live.len() {
            return Err(io::Error::other(format!(
                "write past the end of log segment {id}"
            )));
        }
        seg.live[at..end].copy_from_slice(buf);
        Ok(())
    }

    fn read_at(&self, id: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.injected(SimOp::Read, || {
            format!("a read at {offset} of simulated log segment {id}")
        })?;
        let segments = self.segments.lock();
        let seg = segments.get(&id).ok_or_else(|| no_segment(id))?;
        let at = (offset as usize).min(seg.live.len());
        let n = buf.len().min(seg.live.len() - at);
        buf[..n].copy_from_slice(&seg.live[at..at + n]);
        Ok(n)
    }

    fn sync(&self, id: u64) -> io::Result<()> {
        self.check_writable()?;
        self.injected(SimOp::Sync, || {
            format!("a sync of simulated log segment {id}")
        })?;
        let mut segments = self.segments.lock();
        let seg = segments.get_mut(&id).ok_or_else(|| no_segment(id))?;
        seg.durable.clone_from(&seg.live);
        Ok(())
    }

    fn remove(&self, id: u64) -> io::Result<()> {
        self.segments
            .lock()
            .remove(&id)
            .map(|_| ())
            .ok_or_else(|| no_segment(id))
    }

    fn list(&self) -> io::Result<Vec<u64>> {
        Ok(self.segments.lock().keys().copied().collect())
    }

    fn spares(&self) -> io::Result<Vec<(u64, u64)>> {
        Ok(self
            .spares
            .lock()
            .iter()
            .map(|(&id, seg)| (id, seg.live.len() as u64))
            .collect())
    }

    fn create_spare(&self, id: u64, len_bytes: u64) -> io::Result<()> {
        self.check_writable()?;
        let mut spares = self.spares.lock();
        if spares.contains_key(&id) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("spare {id} exists"),
            ));
        }
        let zero = vec![0u8; len_bytes as usize];
        spares.insert(
            id,
            SimSegment {
                live: zero.clone(),
                durable: zero,
            },
        );
        Ok(())
    }

    fn retire(&self, id: u64) -> io::Result<()> {
        self.check_writable()?;
        // Segments, then spares: the order `crash` takes the locks in.
        let mut segments = self.segments.lock();
        let mut spares = self.spares.lock();
        if spares.contains_key(&id) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("spare {id} exists"),
            ));
        }
        let seg = segments.remove(&id).ok_or_else(|| no_segment(id))?;
        spares.insert(id, seg);
        Ok(())
    }

    fn reuse(&self, spare: u64, id: u64) -> io::Result<()> {
        self.check_writable()?;
        let mut segments = self.segments.lock();
        let mut spares = self.spares.lock();
        if segments.contains_key(&id) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("log segment {id} exists"),
            ));
        }
        let seg = spares.remove(&spare).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("spare {spare} does not exist"),
            )
        })?;
        segments.insert(id, seg);
        Ok(())
    }

    fn remove_spare(&self, id: u64) -> io::Result<()> {
        self.spares.lock().remove(&id).map(|_| ()).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("spare {id} does not exist"),
            )
        })
    }
}
