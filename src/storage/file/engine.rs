//! The IO engines of a file store: how its file is opened (`O_DIRECT` and its
//! fallback), how data pages are read and written (`pread`/`pwrite` or io_uring), and how
//! OS errors come to name the file they concern.
//!
//! # Invariants this module owns
//!
//! - Only allocated data slots are read or written here, and every page read is
//!   verified (checksum, version, kind) before it reaches the caller; every page written
//!   is stamped first.
//! - A failed data write poisons the store before the error is returned.
//! - With `O_DIRECT` asked for, a filesystem that refuses the flag (`EINVAL`) gets
//!   buffered IO instead; any other error of the open is reported.
//! - An OS error of a store opened by path carries a [`PathIoError`] under the OS
//!   error's own kind; the storage layer's typed errors are never wrapped, so
//!   `bfdb::Error` can still lift them into their variants.

use std::cell::Cell;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::super::uring::{self, Direction};
use super::super::{
    CorruptPage, IncompatibleFile, Page, PageKind, PageNo, StorePoisoned, not_allocated,
};
use super::{FileOptions, FileStore, offset_of};

/// How a [`FileStore`] reads and writes its data pages.
///
/// Only data pages go through the engine; the superblocks and the free-list chain,
/// written once per sync, always use `pread`/`pwrite`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IoEngine {
    /// One `pread`/`pwrite` system call per page, on the calling thread.
    #[default]
    Pread,
    /// io_uring, on a ring owned by the calling thread:
    /// [`PageStore::read_pages`](super::super::PageStore::read_pages) and
    /// [`PageStore::write_pages`](super::super::PageStore::write_pages) submit a whole
    /// batch in one system call and keep it in flight together. See the `storage::uring`
    /// module docs.
    IoUring,
}

thread_local! {
    /// Set by [`simulate_o_direct_refused_for_test`].
    static SIMULATE_NO_O_DIRECT: Cell<bool> = const { Cell::new(false) };
}

/// Makes stores (and block devices' segment files) opened by the calling thread behave
/// as if the filesystem refused `O_DIRECT` (for tests of the fallback to buffered IO).
#[doc(hidden)]
pub fn simulate_o_direct_refused_for_test(refused: bool) {
    SIMULATE_NO_O_DIRECT.with(|s| s.set(refused));
}

/// Opens `path` read-write, with `O_DIRECT` if asked and the filesystem accepts it.
/// Returns the file and whether `O_DIRECT` is active.
pub(super) fn open_file(path: &Path, options: &FileOptions) -> io::Result<(File, bool)> {
    let mut open = OpenOptions::new();
    open.read(true).write(true).create(options.create);
    open_maybe_direct(&open, path, options.direct_io)
}

/// Opens `path` as `open` says, with `O_DIRECT` added if `direct` and the filesystem
/// accepts it (else buffered). Returns the file and whether `O_DIRECT` is active. The
/// one place the storage layer opens files for `O_DIRECT`: the file store's and the
/// segment files of a [`BlockDevice`](super::super::BlockDevice).
pub(crate) fn open_maybe_direct(
    open: &OpenOptions,
    path: &Path,
    direct: bool,
) -> io::Result<(File, bool)> {
    if direct && !SIMULATE_NO_O_DIRECT.with(Cell::get) {
        let mut with_direct = open.clone();
        with_direct.custom_flags(libc::O_DIRECT);
        match with_direct.open(path) {
            Ok(file) => return Ok((file, true)),
            // Filesystems without O_DIRECT support (tmpfs on older kernels, some FUSE
            // mounts) refuse the flag with EINVAL; buffered IO still works there.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    Ok((open.open(path)?, false))
}

/// Whether `file` was opened with `O_DIRECT`.
pub(super) fn has_o_direct(file: &File) -> io::Result<bool> {
    let fd = file.as_raw_fd();
    // SAFETY: `fd` belongs to `file`, which stays open for the whole call, and
    // F_GETFL takes no pointer argument, so the call touches no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags & libc::O_DIRECT != 0)
}

/// Fails if `options` ask for an IO engine the calling thread cannot use.
pub(super) fn check_engine(options: &FileOptions) -> io::Result<()> {
    match options.io_engine {
        IoEngine::Pread => Ok(()),
        IoEngine::IoUring => uring::probe_ring(options.sqpoll).map_err(|e| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("io_uring is not available: {e}"),
            )
        }),
    }
}

/// Turns a read that reached the end of the file into the error for a slot that was
/// allocated but never written; other errors pass unchanged.
fn unwritten(no: PageNo, e: io::Error) -> io::Error {
    if e.kind() != io::ErrorKind::UnexpectedEof {
        return e;
    }
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "cannot read page {no}: it lies past the end of the file, so it was allocated \
             but never written"
        ),
    )
}

/// Names `path` in `e`, so that a message like "No such file or directory" says which
/// file it concerns. The kind stays, so callers can still match on it; the original error
/// stays reachable as the source. Errors without a path, errors that already name one, and
/// the storage layer's typed errors (which `bfdb::Error` lifts into their own variants)
/// pass unchanged.
pub(crate) fn name_path(path: Option<&Path>, e: io::Error) -> io::Error {
    let Some(path) = path else {
        return e;
    };
    if let Some(inner) = e.get_ref()
        && (inner.is::<PathIoError>()
            || inner.is::<CorruptPage>()
            || inner.is::<IncompatibleFile>()
            || inner.is::<StorePoisoned>())
    {
        return e;
    }
    io::Error::new(
        e.kind(),
        PathIoError {
            path: path.to_path_buf(),
            source: e,
        },
    )
}

/// The detail inside an `io::Error` from a [`FileStore`] opened by path: the OS error and
/// the file or directory it concerns.
///
/// It travels as `io::Error::new(source.kind(), PathIoError { .. })`, so the error's kind
/// is that of the OS error; its message reads `"<path>: <OS error>"`.
#[derive(Debug)]
pub struct PathIoError {
    /// The file or directory the failed operation was on.
    pub path: PathBuf,
    /// The error the operating system reported.
    pub source: io::Error,
}

impl fmt::Display for PathIoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.source)
    }
}

impl std::error::Error for PathIoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl FileStore {
    /// Names the store's path, if it has one, in an error of its file (see `name_path`).
    pub(super) fn at_path(&self, e: io::Error) -> io::Error {
        name_path(self.path.as_deref(), e)
    }

    /// Reads and verifies data page `no`, on the store's engine.
    pub(super) fn read_data(&self, no: PageNo, page: &mut Page) -> io::Result<()> {
        if self.io_engine == IoEngine::IoUring {
            return self.read_pages_uring(&mut [(no, page)]);
        }
        if !self.state.read().is_allocated(no.0) {
            return Err(not_allocated(no, "read"));
        }
        self.file
            .read_exact_at(page.as_bytes_mut(), offset_of(no.0))
            .map_err(|e| self.at_path(unwritten(no, e)))?;
        page.verify(no, PageKind::Data)
    }

    /// Stamps and writes data page `no`, on the store's engine.
    pub(super) fn write_data(&self, no: PageNo, page: &mut Page) -> io::Result<()> {
        if self.io_engine == IoEngine::IoUring {
            return self.write_pages_uring(&mut [(no, page)]);
        }
        self.poison.check()?;
        if !self.state.read().is_allocated(no.0) {
            return Err(not_allocated(no, "write"));
        }
        page.stamp(PageKind::Data);
        self.file
            .write_all_at(page.as_bytes(), offset_of(no.0))
            .map_err(|e| self.poison.poison(self.at_path(e)))
    }

    /// Reads and verifies several data pages: one batch on io_uring, one by one else.
    pub(super) fn read_data_batch(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        if self.io_engine == IoEngine::IoUring {
            return self.read_pages_uring(reqs);
        }
        for (no, page) in reqs.iter_mut() {
            self.read_data(*no, page)?;
        }
        Ok(())
    }

    /// Stamps and writes several data pages: one batch on io_uring, one by one else.
    pub(super) fn write_data_batch(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        if self.io_engine == IoEngine::IoUring {
            return self.write_pages_uring(reqs);
        }
        for (no, page) in reqs.iter_mut() {
            self.write_data(*no, page)?;
        }
        Ok(())
    }

    /// Reads data pages through io_uring, all in one batch, then verifies each.
    fn read_pages_uring(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        {
            let st = self.state.read();
            if let Some((no, _)) = reqs.iter().find(|(no, _)| !st.is_allocated(no.0)) {
                return Err(not_allocated(*no, "read"));
            }
        }
        let fd = self.file.as_raw_fd();
        uring::submit_pages(fd, Direction::Read, self.sqpoll, reqs).map_err(|(i, e)| {
            let no = reqs.get(i).map_or(PageNo(0), |(no, _)| *no);
            self.at_path(unwritten(no, e))
        })?;
        for (no, page) in reqs.iter() {
            page.verify(*no, PageKind::Data)?;
        }
        Ok(())
    }

    /// Stamps and writes data pages through io_uring, all in one batch.
    fn write_pages_uring(&self, reqs: &mut [(PageNo, &mut Page)]) -> io::Result<()> {
        self.poison.check()?;
        {
            let st = self.state.read();
            if let Some((no, _)) = reqs.iter().find(|(no, _)| !st.is_allocated(no.0)) {
                return Err(not_allocated(*no, "write"));
            }
        }
        for (_, page) in reqs.iter_mut() {
            page.stamp(PageKind::Data);
        }
        let fd = self.file.as_raw_fd();
        uring::submit_pages(fd, Direction::Write, self.sqpoll, reqs)
            .map_err(|(_, e)| self.poison.poison(self.at_path(e)))
    }
}
