//! [`WriteBatch`]: writes to several keys and keyspaces of one database, applied
//! atomically by [`Db::write`](crate::Db::write).

use crate::hash::store::HashStore;
use crate::tree::Tree;

/// One write of a batch.
#[derive(Clone, Debug)]
pub(crate) struct BatchOp {
    /// The keyspace's id; 0 if the tree given was not a keyspace of a database.
    pub(crate) keyspace: u32,
    /// The database the tree belongs to (its journal's address), to refuse a batch
    /// mixing databases.
    pub(crate) db: usize,
    pub(crate) key: Vec<u8>,
    /// `None` deletes.
    pub(crate) value: Option<Vec<u8>>,
}

/// Writes to several keys, in one or more keyspaces (trees and hash stores) of a
/// [`Db`](crate::Db), that
/// [`Db::write`](crate::Db::write) applies atomically: after a crash all of them are
/// there or none is, and a [`Tree::get_many`] never sees some without the others.
///
/// Writes apply in the order they were added; a later write of the same key wins. The
/// batch checks nothing until it is written.
///
/// ```
/// use bfdb::{Db, DbOptions, Durability, WriteBatch};
/// # let dir = tempfile::tempdir()?;
/// let db = Db::open(dir.path(), DbOptions::default())?;
/// let (accounts, log) = (db.tree("accounts")?, db.tree("transfers")?);
/// accounts.insert(b"alice", b"100")?;
///
/// let mut batch = WriteBatch::new();
/// batch.insert(&accounts, b"alice", b"70");
/// batch.insert(&accounts, b"bob", b"30");
/// batch.insert(&log, b"0001", b"alice->bob 30");
/// db.write_with(batch, Durability::Synced)?;
///
/// let got = accounts.get_many(&[&b"alice"[..], b"bob"])?;
/// assert_eq!(got, [Some(b"70".to_vec()), Some(b"30".to_vec())]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct WriteBatch {
    pub(crate) ops: Vec<BatchOp>,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> WriteBatch {
        WriteBatch::default()
    }

    /// Adds an insert (or replacement) of `key` in `tree`.
    pub fn insert(&mut self, tree: &Tree, key: &[u8], value: &[u8]) {
        self.push(tree, key, Some(value));
    }

    /// Adds a delete of `key` from `tree`.
    pub fn delete(&mut self, tree: &Tree, key: &[u8]) {
        self.push(tree, key, None);
    }

    /// Adds an insert (or replacement) of `key` in hash keyspace `store`.
    pub fn insert_hash(&mut self, store: &HashStore, key: &[u8], value: &[u8]) {
        self.push_hash(store, key, Some(value));
    }

    /// Adds a delete of `key` from hash keyspace `store`.
    pub fn delete_hash(&mut self, store: &HashStore, key: &[u8]) {
        self.push_hash(store, key, None);
    }

    /// Writes in the batch.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch has no writes.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Removes every write, keeping the allocation.
    pub fn clear(&mut self) {
        self.ops.clear();
    }

    fn push_hash(&mut self, store: &HashStore, key: &[u8], value: Option<&[u8]>) {
        let a = store.attached();
        self.ops.push(BatchOp {
            keyspace: a.keyspace,
            db: std::sync::Arc::as_ptr(&a.journal) as usize,
            key: key.to_vec(),
            value: value.map(<[u8]>::to_vec),
        });
    }

    fn push(&mut self, tree: &Tree, key: &[u8], value: Option<&[u8]>) {
        let (keyspace, db) = tree
            .attached()
            .map_or((0, 0), |a| (a.keyspace, a.journal_id()));
        self.ops.push(BatchOp {
            keyspace,
            db,
            key: key.to_vec(),
            value: value.map(<[u8]>::to_vec),
        });
    }
}
