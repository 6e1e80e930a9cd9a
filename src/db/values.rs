//! The database's value store as each tree keyspace sees it: the [`ValueHost`] a tree
//! is given when it is attached, binding the store (`storage/values.rs`) to the
//! keyspace's id, which the store records with the keys whose fate a checkpoint leaves
//! open.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::storage::{ValueRef, ValueStore};
use crate::tree::ValueHost;

/// The value store seen by keyspace `keyspace`.
pub(super) struct KeyspaceValues {
    pub(super) store: Arc<ValueStore>,
    pub(super) keyspace: u32,
}

impl KeyspaceValues {
    /// The reference `bytes` encode, which a leaf record or log record held.
    fn decode(&self, bytes: &[u8]) -> Result<ValueRef> {
        ValueRef::decode(bytes).ok_or_else(|| Error::Corrupted {
            page: 0,
            reason: format!(
                "keyspace #{}: a record's out-of-line value reference does not decode ({} bytes)",
                self.keyspace,
                bytes.len()
            ),
        })
    }
}

impl ValueHost for KeyspaceValues {
    fn write(&self, value: &[u8]) -> Result<Vec<u8>> {
        // A tree writes its values holding nothing a checkpoint needs (a single write
        // before its stripe and page lock, a batch before its stripes): it may wait.
        self.store.make_room();
        Ok(self.store.write(value)?.encode().to_vec())
    }

    fn read(&self, reference: &[u8], out: &mut Vec<u8>) -> Result<()> {
        let r = self.decode(reference)?;
        // (`Db::delay_value_reads_for_test` makes the store's read wait.)
        self.store.read(&r, out)
    }

    #[cfg(feature = "tokio-uring")]
    fn on_ring(&self, reference: &[u8]) -> Result<Option<(Arc<ValueStore>, ValueRef)>> {
        Ok(Some((Arc::clone(&self.store), self.decode(reference)?)))
    }

    fn read_many(&self, references: &[Vec<u8>], outs: &mut [Vec<u8>]) -> Result<()> {
        let refs: Vec<ValueRef> = references
            .iter()
            .map(|r| self.decode(r))
            .collect::<Result<_>>()?;
        self.store.read_many(&refs, outs)
    }

    fn read_part(
        &self,
        reference: &[u8],
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let r = self.decode(reference)?;
        let end = offset.saturating_add(len as u64).min(u64::from(r.len));
        let start = offset.min(end);
        self.store
            .read_range(&r, start, (end - start) as usize, out)
    }

    fn applied(&self, reference: &[u8], key: &[u8]) {
        if let Ok(r) = self.decode(reference) {
            self.store.applied(r, self.keyspace, key);
        }
    }

    fn replaced(&self, reference: &[u8], key: &[u8]) {
        if let Ok(r) = self.decode(reference) {
            self.store.free(r, self.keyspace, key);
        }
    }

    fn holds_values(&self) -> bool {
        self.store.holds_values()
    }

    fn guard(&self) -> Option<crate::storage::ReadGuard> {
        self.store.holds_values().then(|| self.store.read_guard())
    }

    fn keyspace_dropped(&self) {
        let keyspace = self.keyspace;
        self.store.drop_keyspaces(|k| k == keyspace);
    }
}
