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
//! ([`BlockDevice::read_target`](crate::storage::BlockDevice::read_target)), on the
//! ring through the storage layer (`storage::read_on_ring`, a duplicate of the file's
//! descriptor): a truncation that deletes the file meanwhile leaves its bytes readable.
//! A device without files (none in a `Db`) is read on the spot, blocking the thread.

use std::sync::Arc;

use super::pending::{DeviceRead, Rounds};
use super::store::HashStore;
use crate::error::Result;
use crate::storage;

/// Async reads of a [`HashStore`] for tasks of a tokio-uring runtime.
///
/// Made from an `Arc<HashStore>`, which other threads may keep using (writes included)
/// at the same time. Like tokio-uring's own types it is not `Send`: make one per runtime
/// thread. Reads that find their key in memory finish without awaiting anything; each
/// read that needs the disk awaits it, so a runtime thread with many read tasks keeps
/// as many disk reads in flight.
///
/// In a [`Db`](crate::Db) that holds values kept out of line, a read holds the value
/// store's read guard from its lookup until it has read the value, across its awaits,
/// and a checkpoint's release of freed values waits for such guards: do not block a
/// runtime thread on [`Db::checkpoint`](crate::Db::checkpoint) or
/// [`Db::close`](crate::Db::close) while reads of that thread are pending (the
/// database's background checkpoints run on their own thread).
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
        // Before the lookup: a value out of line is read after it, outside the epoch
        // (the guard is `Send`, so it may live across the awaits).
        let _guard = self.store.value_guard();
        loop {
            let mut reads = {
                let mut handle = f2.epoch().register();
                rounds
                    .round(&mut handle, &keys, |g, key| f2.read(g, key))
                    .map_err(|e| self.store.attached().named(e))?
            };
            if reads.is_empty() {
                let found = rounds.answers().pop().expect("one key, one answer");
                return self.store.resolve_on_ring(found).await;
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
    if let Ok(bytes) = storage::read_on_ring(file, offset, len).await {
        read.fill(bytes.as_ref());
    }
}
