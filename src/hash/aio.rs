//! Async reads of a hash keyspace on a tokio-uring runtime (feature `tokio-uring`):
//! [`AsyncHashStore`].
//!
//! A read runs as a batch of one in the rounds of [`super::pending`]: it looks up its
//! key in memory under an epoch guard; when it needs a record or an index chunk from
//! disk, the guard is dropped, the read is submitted on the runtime's ring and awaited,
//! and the lookup runs again with the bytes read. So the thread runs other tasks while
//! the disk works, and no epoch is held across an `.await` (a task left waiting would
//! otherwise hold back every page close and flush of the store).
//!
//! The read goes to the segment file the device handed out under the guard
//! ([`BlockDevice::read_target`](crate::storage::BlockDevice::read_target)), through a
//! duplicate of its descriptor owned by the ring's `File`: a truncation that deletes the
//! file meanwhile leaves its bytes readable. A device without files (none in a `Db`)
//! is read on the spot, blocking the thread.

use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;

use tokio_uring::buf::{IoBuf, IoBufMut};

use super::pending::{DeviceRead, Rounds};
use super::store::HashStore;
use crate::error::{Error, Result};
use crate::storage::AlignedBuf;

/// Async reads of a [`HashStore`] for tasks of a tokio-uring runtime.
///
/// Made from an `Arc<HashStore>`, which other threads may keep using (writes included)
/// at the same time. Like tokio-uring's own types it is not `Send`: make one per runtime
/// thread. Reads that find their key in memory finish without awaiting anything; each
/// read that needs the disk awaits it, so a runtime thread with many read tasks keeps
/// as many disk reads in flight.
///
/// ```no_run
/// use std::sync::Arc;
///
/// let db = bfdb::Db::open("/tmp/bfdb-hash-aio-doc", bfdb::DbOptions::default())?;
/// let store = db.hash_store("sessions")?;
/// store.insert(b"ann", b"1")?;
/// tokio_uring::start(async {
///     let reader = bfdb::aio::AsyncHashStore::new(Arc::clone(&store));
///     assert_eq!(reader.get(b"ann").await?.as_deref(), Some(&b"1"[..]));
///     assert_eq!(reader.get(b"bob").await?, None);
///     Ok::<(), bfdb::Error>(())
/// })?;
/// # Ok::<(), bfdb::Error>(())
/// ```
pub struct AsyncHashStore {
    store: Arc<HashStore>,
    /// Not `Send`, as the runtime's files are not.
    _not_send: std::marker::PhantomData<std::rc::Rc<()>>,
}

impl std::fmt::Debug for AsyncHashStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncHashStore")
            .field("store", &self.store)
            .finish()
    }
}

impl AsyncHashStore {
    /// Async reads of `store`.
    pub fn new(store: Arc<HashStore>) -> AsyncHashStore {
        AsyncHashStore {
            store,
            _not_send: std::marker::PhantomData,
        }
    }

    /// The store read by this handle, for its synchronous API (writes, stats).
    pub fn store(&self) -> &Arc<HashStore> {
        &self.store
    }

    /// The value stored under `key`, if any; as [`HashStore::get`], with the disk
    /// reads it needs awaited on the runtime's ring. Must be awaited inside a
    /// tokio-uring runtime.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.store.check_key(key)?;
        let f2 = self.store.f2();
        let keys = [key];
        let mut rounds = Rounds::new(1);
        loop {
            let mut reads = {
                let mut handle = f2.epoch().register();
                rounds
                    .round(&mut handle, &keys, |g, key| f2.get(g, key))
                    .map_err(|e| self.store.attached().named(e))?
            };
            if reads.is_empty() {
                return Ok(rounds.answers().pop().expect("one key, one answer"));
            }
            f2.count_batch_round(reads.len());
            for read in &mut reads {
                read_on_ring(read).await;
            }
            rounds.complete(reads);
        }
    }
}

/// Does `read` on the runtime's ring if it is still to do on a file. A read that fails
/// stays not done: its lookup asks again (see [`super::pending`]).
async fn read_on_ring(read: &mut DeviceRead) {
    let Some((file, offset, buf)) = read.file_read() else {
        return;
    };
    let len = buf.as_ref().len();
    let Ok(file) = duplicate(file) else {
        return;
    };
    let (result, bytes) = file
        .read_exact_at(RingBuf(AlignedBuf::new(len)), offset)
        .await;
    // Closing a duplicate cannot lose data (nothing was written through it).
    let _ = file.close().await;
    if result.is_ok() {
        read.fill(bytes.0.as_ref());
    }
}

/// A tokio-uring `File` on a duplicate of `file`'s descriptor (the ring's `File` closes
/// the descriptor it owns; the device keeps its own).
fn duplicate(file: &std::fs::File) -> Result<tokio_uring::fs::File> {
    // SAFETY: `fcntl` only reads the descriptor number, which `file` keeps open.
    let dup = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(Error::Io(std::io::Error::last_os_error()));
    }
    // SAFETY: `dup` is a fresh descriptor nothing else owns; the `File` takes it over.
    let std_file = unsafe { std::fs::File::from_raw_fd(dup) };
    Ok(tokio_uring::fs::File::from_std(std_file))
}

/// An aligned buffer (for `O_DIRECT`) as a tokio-uring buffer.
struct RingBuf(AlignedBuf);

// SAFETY: the bytes live in the `AlignedBuf`'s heap allocation, which does not move
// when the `RingBuf` moves and stays allocated while the runtime owns it; every byte is
// initialised (zeroed when allocated).
unsafe impl IoBuf for RingBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.0.as_ref().as_ptr()
    }

    fn bytes_init(&self) -> usize {
        self.0.as_ref().len()
    }

    fn bytes_total(&self) -> usize {
        self.0.as_ref().len()
    }
}

// SAFETY: as for `IoBuf`; the pointer is to the same stable, writable allocation.
unsafe impl IoBufMut for RingBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut().as_mut_ptr()
    }

    unsafe fn set_init(&mut self, _pos: usize) {
        // Every byte is initialised from the start.
    }
}
