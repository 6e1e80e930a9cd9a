//! The files of the database directory: every name (the lock, the manifest, checkpoint
//! files, page files, temporary files; a hash keyspace's log files are named by
//! `hash::store`), the lock, the manifest of a new database, writing the manifest and
//! checkpoint files durably, and removing what a crash or a drop left behind.
//!
//! # Replacing a file
//!
//! A new manifest is written to `MANIFEST.tmp`, synced, renamed over `MANIFEST`, and the
//! directory is synced: a crash leaves the old manifest or the new one, never a mix. A
//! checkpoint file is written to `ckpt-<generation>.tmp`, synced, renamed, and the
//! directory synced; it counts only once the manifest names it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::hash::store as hash_store;
use crate::storage::{ActiveBackend, LogDevice, SimPages};
use crate::tree::open_file_store;

use super::checkpoint::Checkpoint;
use super::manifest::{KeyspaceKind, Manifest};
use super::{DbOptions, Shared};

/// The lock file's name in the database directory.
pub(super) const LOCK: &str = "LOCK";

/// The manifest's file name in the database directory.
pub(super) const MANIFEST: &str = "MANIFEST";
/// Where a new manifest is written before it replaces the old one.
pub(super) const MANIFEST_TMP: &str = "MANIFEST.tmp";

/// The file name of checkpoint `generation`.
pub(super) fn checkpoint_file_name(generation: u64) -> String {
    format!("ckpt-{generation:016x}")
}

/// The path of checkpoint `generation` in `dir`.
pub(super) fn checkpoint_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(checkpoint_file_name(generation))
}

/// Where the keyspaces' page files live.
#[derive(Clone, Debug)]
pub(super) enum Pages {
    /// A page file per keyspace in the directory.
    Files,
    /// Simulated page files (`Db::open_simulated`).
    Sim(Arc<SimPages>),
}

/// The name of the value store's simulated file (`Db::open_simulated`); its real files
/// are `values-<segment as 8 hex>.vlog` (`storage::values::value_files`).
pub(super) const VALUE_FILE: &str = "values";

/// The page file of keyspace `id`.
pub(super) fn page_file(id: u32) -> String {
    format!("ks-{id:08x}.pages")
}

/// Opens and `flock`s the directory's lock file; `true` if this call created it.
pub(super) fn lock_dir(dir: &Path) -> Result<(File, bool)> {
    let path = dir.join(LOCK);
    let existed = path.exists();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::Io(named(&path, e)))?;
    // SAFETY: `flock` on a file descriptor this function owns; it reads no memory.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(if e.kind() == io::ErrorKind::WouldBlock {
            Error::Locked { path }
        } else {
            Error::Io(named(&path, e))
        });
    }
    Ok((file, !existed))
}

/// Writes the manifest of a new, empty database in `dir` — if `dir` holds nothing else
/// and creating is allowed; otherwise the directory is not a bfdb database, and it is
/// left as it is.
pub(super) fn create_manifest(
    dir: &Path,
    options: &DbOptions,
    log: &dyn LogDevice,
) -> Result<Manifest> {
    let foreign: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| Error::Io(named(dir, e)))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name != LOCK && name != MANIFEST_TMP)
        .collect();
    let has_log = !log.list().map_err(Error::Io)?.is_empty();
    if !foreign.is_empty() || has_log {
        let mut what = foreign;
        what.sort();
        what.truncate(3);
        return Err(Error::Incompatible {
            reason: format!(
                "{} is not a bfdb database: it has no {MANIFEST} but holds {}",
                dir.display(),
                if what.is_empty() {
                    "log segments".to_string()
                } else {
                    what.join(", ")
                }
            ),
        });
    }
    if !options.create {
        return Err(Error::Io(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{}: no database here, and DbOptions::create is off",
                dir.display()
            ),
        )));
    }
    let manifest = Manifest::default();
    manifest.store(dir)?;
    Ok(manifest)
}

/// The error for a database directory that is not there.
pub(super) fn no_database(dir: &Path) -> Error {
    Error::Io(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "{}: no such database directory (DbOptions::create makes one)",
            dir.display()
        ),
    ))
}

/// How long opening a page file waits for the IO of a process that died holding it.
const PAGE_FILE_RELEASE_WAIT: Duration = Duration::from_secs(10);

/// Opens a keyspace's page file. The directory's lock is held, so no live database has
/// the file open; if its own lock is still held, a process that held it died with IO in
/// flight (io_uring requests outlive their process until the kernel tears its ring
/// down, and the lock goes with the last of them). Those writes must land before this
/// process reuses the slots they target, so the open waits for the lock, a bounded time.
pub(super) fn open_page_file(
    path: &Path,
    config: &Config,
) -> Result<(crate::storage::FileStore, ActiveBackend)> {
    let started = Instant::now();
    loop {
        match open_file_store(path, config) {
            Err(Error::Io(e))
                if e.kind() == io::ErrorKind::WouldBlock
                    && started.elapsed() < PAGE_FILE_RELEASE_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

impl Shared {
    /// Removes what a crash or a drop left behind: temporary files, checkpoint files
    /// above `newest` (the newest checkpoint the manifest named at the open: those were
    /// never committed) or below the oldest one `manifest` keeps (superseded: a crash
    /// came between a commit and the retirement of the checkpoint it pushed out), and
    /// page files of keyspaces `manifest` does not list. A
    /// damaged checkpoint file recovery skipped is left for its owner to look at (until
    /// an open finds it above the newest the manifest names).
    pub(super) fn remove_stale_files(&self, manifest: &Manifest, newest: u64) -> Result<()> {
        let live_pages: Vec<String> = manifest
            .keyspaces
            .values()
            .filter(|e| matches!(e.kind, KeyspaceKind::Tree { .. }))
            .map(|e| page_file(e.id))
            .collect();
        let live_hash: Vec<u32> = manifest
            .keyspaces
            .values()
            .filter(|e| matches!(e.kind, KeyspaceKind::Hash(_)))
            .map(|e| e.id)
            .collect();
        let stale_hash =
            |name: &str| hash_store::file_owner(name).is_some_and(|id| !live_hash.contains(&id));
        let entries = std::fs::read_dir(&self.dir).map_err(|e| Error::Io(named(&self.dir, e)))?;
        // Checkpoints older than the oldest one kept were superseded: a crash between a
        // checkpoint's commit and the retirement of the third-oldest leaves its file.
        let oldest_kept = manifest.checkpoints.iter().map(|c| c.generation).min();
        for entry in entries {
            let entry = entry.map_err(|e| Error::Io(named(&self.dir, e)))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let generation = name
                .strip_prefix("ckpt-")
                .and_then(|g| u64::from_str_radix(g, 16).ok());
            let uncommitted = generation.is_some_and(|g| g > newest);
            let superseded = generation.is_some_and(|g| oldest_kept.is_some_and(|o| g < o));
            let stale_pages = matches!(self.pages, Pages::Files)
                && name.starts_with("ks-")
                && name.ends_with(".pages")
                && !live_pages.contains(&name);
            let stale_log = matches!(self.pages, Pages::Files) && stale_hash(&name);
            if name.ends_with(".tmp") || uncommitted || superseded || stale_pages || stale_log {
                std::fs::remove_file(entry.path())
                    .map_err(|e| Error::Io(named(&entry.path(), e)))?;
            }
        }
        if let Pages::Sim(sim) = &self.pages {
            for name in sim.names() {
                if !live_pages.contains(&name) {
                    sim.remove(&name);
                }
            }
            for name in sim.block_names() {
                if stale_hash(&name) {
                    sim.remove_blocks(&name);
                }
            }
        }
        Ok(())
    }

    /// Removes every log file of hash keyspace `id`.
    pub(super) fn remove_hash_files(&self, id: u32) -> Result<()> {
        match &self.pages {
            Pages::Files => {
                let entries =
                    std::fs::read_dir(&self.dir).map_err(|e| Error::Io(named(&self.dir, e)))?;
                for entry in entries {
                    let entry = entry.map_err(|e| Error::Io(named(&self.dir, e)))?;
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if hash_store::is_file_of(&name, id) {
                        std::fs::remove_file(entry.path())
                            .map_err(|e| Error::Io(named(&entry.path(), e)))?;
                    }
                }
            }
            Pages::Sim(sim) => {
                for name in sim.block_names() {
                    if hash_store::is_file_of(&name, id) {
                        sim.remove_blocks(&name);
                    }
                }
            }
        }
        Ok(())
    }
}

impl Manifest {
    /// Reads the manifest of `dir`; `None` if there is none.
    pub(crate) fn load(dir: &Path) -> Result<Option<Manifest>> {
        let path = dir.join(MANIFEST);
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(Manifest::decode(&path, &bytes)?)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::Io(named(&path, e))),
        }
    }

    /// Replaces the manifest of `dir` with this one, atomically and durably (see the
    /// module docs).
    pub(crate) fn store(&self, dir: &Path) -> Result<()> {
        let tmp = dir.join(MANIFEST_TMP);
        let path = dir.join(MANIFEST);
        // Each step's error names the file it failed on.
        let write = || -> io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            f.write_all(&self.encode())?;
            f.sync_all()
        };
        write().map_err(|e| Error::Io(named(&tmp, e)))?;
        fs::rename(&tmp, &path).map_err(|e| Error::Io(named(&path, e)))?;
        sync_dir(dir).map_err(|e| Error::Io(named(dir, e)))
    }
}

impl Checkpoint {
    /// Reads and decodes checkpoint `generation` of `dir`.
    pub(crate) fn load(dir: &Path, generation: u64) -> Result<Checkpoint> {
        let path = checkpoint_path(dir, generation);
        let bytes = fs::read(&path).map_err(|e| Error::Io(named(&path, e)))?;
        let ckpt = Checkpoint::decode(&path, &bytes)?;
        if ckpt.generation != generation {
            return Err(Error::CorruptFile {
                path,
                reason: format!("it holds checkpoint {}", ckpt.generation),
            });
        }
        Ok(ckpt)
    }

    /// Writes the checkpoint's file in `dir` durably (see the module docs).
    pub(crate) fn store(&self, dir: &Path) -> Result<()> {
        let path = checkpoint_path(dir, self.generation);
        let tmp = dir.join(format!("{}.tmp", checkpoint_file_name(self.generation)));
        let write = || -> io::Result<()> {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            let mut w = io::BufWriter::with_capacity(1 << 20, f);
            self.write_to(&mut w)?;
            let f = w.into_inner().map_err(io::IntoInnerError::into_error)?;
            f.sync_all()
        };
        // Each step's error names the file it failed on.
        write().map_err(|e| Error::Io(named(&tmp, e)))?;
        fs::rename(&tmp, &path).map_err(|e| Error::Io(named(&path, e)))?;
        sync_dir(dir).map_err(|e| Error::Io(named(dir, e)))
    }
}

/// Syncs `dir`, making the creation, removal or renaming of its entries durable.
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `e` naming `path`, as every IO error of a database file does (kind kept).
pub(super) fn named(path: &Path, e: io::Error) -> io::Error {
    crate::storage::name_path(Some(path), e)
}
