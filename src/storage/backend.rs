//! Opening a [`FileStore`] on the IO path a caller asks for, with the fallbacks the
//! system forces.
//!
//! Two fallbacks exist: from io_uring to `pread`/`pwrite` where the kernel refuses
//! io_uring (old kernel, seccomp, `kernel.io_uring_disabled`), when the caller allows it;
//! and from `O_DIRECT` to buffered IO where the filesystem refuses `O_DIRECT`. Each is
//! logged once per process (`log::warn!`), so that a process opening many stores says it
//! once, and reported with every store it affects in [`ActiveBackend::notice`].
//!
//! This module knows IO paths, not configurations: its caller translates its own
//! settings into an [`IoRequest`] and the [`OpenError`] back into its own errors.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{FileOptions, FileStore, IoEngine, uring};

/// Whether a file store should move its data pages through io_uring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IoUringUse {
    /// Never: `pread`/`pwrite`.
    Never,
    /// Always: opening fails with [`OpenError::IoUringRefused`] where the kernel refuses
    /// io_uring.
    Required,
    /// Where the kernel allows it, else `pread`/`pwrite` with a notice.
    Preferred,
}

/// The IO path a caller asks of a file store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IoRequest {
    /// Whether to use io_uring.
    pub(crate) io_uring: IoUringUse,
    /// Ask for `O_DIRECT`; buffered IO, with a notice, where the filesystem refuses it.
    pub(crate) direct_io: bool,
    /// With io_uring: SQPOLL rings.
    pub(crate) sqpoll: bool,
}

/// What a page store runs on, as decided when it was opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ActiveBackend {
    /// `"memory"` (a [`MemoryStore`](super::MemoryStore)), `"std"` (`pread`/`pwrite`
    /// through the OS page cache), `"std_direct"` (`pread`/`pwrite` with `O_DIRECT`),
    /// `"io_uring"`, or `"custom"` (a page store the caller built).
    pub(crate) name: &'static str,
    /// Whether data pages bypass the OS page cache.
    pub(crate) direct_io: bool,
    /// Why the backend differs from what was asked for, if it does.
    pub(crate) notice: Option<String>,
}

impl ActiveBackend {
    /// A memory store.
    pub(crate) fn memory() -> ActiveBackend {
        ActiveBackend {
            name: "memory",
            direct_io: false,
            notice: None,
        }
    }

    /// A page store the caller built, of which nothing is known.
    pub(crate) fn custom() -> ActiveBackend {
        ActiveBackend {
            name: "custom",
            direct_io: false,
            notice: None,
        }
    }
}

/// Why [`open_with_fallback`] opened no store.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// io_uring was [required](IoUringUse::Required) and the kernel refuses it; the
    /// probe's error says how.
    IoUringRefused(io::Error),
    /// Opening the file failed.
    Io(io::Error),
}

/// Set once the io_uring fallback has been logged.
static WARNED_IO_URING: AtomicBool = AtomicBool::new(false);
/// Set once the buffered-IO fallback has been logged.
static WARNED_O_DIRECT: AtomicBool = AtomicBool::new(false);

/// Logs `notice` unless `flag` says it was logged before.
fn warn_once(flag: &AtomicBool, notice: &str) {
    // Relaxed: the flag only keeps a log line from repeating; no data hangs on it.
    if !flag.swap(true, Ordering::Relaxed) {
        log::warn!("bfdb: {notice}");
    }
}

/// Opens the file store at `path` on the IO path `request` asks for, falling back where
/// the system refuses (see the module docs), and says what it runs on.
pub(crate) fn open_with_fallback(
    path: &Path,
    request: IoRequest,
) -> Result<(FileStore, ActiveBackend), OpenError> {
    let mut notices = Vec::new();
    let engine = match request.io_uring {
        IoUringUse::Never => IoEngine::Pread,
        IoUringUse::Required => match uring::probe() {
            Ok(()) => IoEngine::IoUring,
            Err(e) => return Err(OpenError::IoUringRefused(e)),
        },
        IoUringUse::Preferred => match uring::probe() {
            Ok(()) => IoEngine::IoUring,
            Err(e) => {
                let notice = format!("io_uring is not available ({e}); using pread/pwrite");
                warn_once(&WARNED_IO_URING, &notice);
                notices.push(notice);
                IoEngine::Pread
            }
        },
    };
    let options = FileOptions::default()
        .direct_io(request.direct_io)
        .io_engine(engine)
        .sqpoll(request.sqpoll);
    let store = FileStore::open(path, options).map_err(OpenError::Io)?;
    let direct_io = store.direct_io_active();
    if request.direct_io && !direct_io {
        let notice = format!(
            "the filesystem of {} refuses O_DIRECT; using buffered IO through the OS page \
             cache, which the memory budget does not bound",
            path.display()
        );
        warn_once(&WARNED_O_DIRECT, &notice);
        notices.push(notice);
    }
    let name = match (engine, direct_io) {
        (IoEngine::IoUring, _) => "io_uring",
        (_, true) => "std_direct",
        (_, false) => "std",
    };
    let active = ActiveBackend {
        name,
        direct_io,
        notice: (!notices.is_empty()).then(|| notices.join("; ")),
    };
    Ok((store, active))
}
