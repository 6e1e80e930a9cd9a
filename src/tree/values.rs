//! Values kept out of line: a record of type `InsertExternal` or `CacheExternal` holds a
//! reference to its value in the database's value store instead of the value's bytes.
//! The tree stores and moves such references as it moves any value; this module is
//! where it meets the store: resolving a reference a read found, telling the store when
//! a write makes a referenced value unreachable, and guarding reads against the reuse
//! of a freed extent.
//!
//! **When a value is unreachable.** A write of key `k` makes the value its previous
//! version referenced unreachable the moment it is placed: every later read of `k` sees
//! the new version. The tree tells the store ([`ValueHost::replaced`]) wherever it sees
//! a version shadowed by a newer one of the same key with another value: the write
//! itself, for the version in the page's mini-page, and a merge (or the building of a
//! mirror), for the version in the leaf page. The same value may be reported more than
//! once (a clean copy in the mini-page and the leaf record it copies); the store
//! ignores a report for a value it no longer holds as allocated. A report may come
//! after a later checkpoint than the write (the leaf's version is found at the next
//! merge): the store then keeps the extent a little longer than it had to, never
//! shorter. The store's own rule decides when the extent may be reused (after the
//! checkpoints that might still recover the old version are gone); see
//! `storage/values.rs`.
//!
//! Uses: `node` (record types), `read::Found`.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::storage::ReadGuard;
#[cfg(feature = "tokio-uring")]
use crate::storage::{ValueRef, ValueStore};

use super::Core;
use super::read::Found;

/// A write's value as its keyspace stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored<'a> {
    /// The value's bytes.
    Inline(&'a [u8]),
    /// The reference of a value already written to the value store.
    External(&'a [u8]),
}

impl<'a> Stored<'a> {
    /// The bytes the record keeps, and its (dirty) record type.
    pub(super) fn record(self) -> (&'a [u8], super::node::RecordType) {
        match self {
            Stored::Inline(v) => (v, super::node::RecordType::Insert),
            Stored::External(r) => (r, super::node::RecordType::InsertExternal),
        }
    }
}

/// The value store as one keyspace sees it.
pub(crate) trait ValueHost: Send + Sync {
    /// Writes `value` to the store and returns its reference, pending until a record
    /// that references it is placed ([`ValueHost::applied`]).
    fn write(&self, value: &[u8]) -> Result<Vec<u8>>;
    /// Appends the value `reference` names to `out`.
    fn read(&self, reference: &[u8], out: &mut Vec<u8>) -> Result<()>;
    /// Sets each of `outs` to the value its reference in `references` names, with the
    /// reads in flight together where the store can; by default one after another.
    fn read_many(&self, references: &[Vec<u8>], outs: &mut [Vec<u8>]) -> Result<()> {
        for (reference, out) in references.iter().zip(outs) {
            out.clear();
            self.read(reference, out)?;
        }
        Ok(())
    }
    /// The store and the decoded reference, for a read of the value `reference` names
    /// on the async runtime's ring ([`ValueStore::read_on_ring`]); `None` (the default)
    /// where the host has no such store, and the async read uses [`ValueHost::read`].
    #[cfg(feature = "tokio-uring")]
    fn on_ring(&self, _reference: &[u8]) -> Result<Option<(Arc<ValueStore>, ValueRef)>> {
        Ok(None)
    }
    /// Sets `out` to the bytes `offset..offset + len` of the value `reference` names, as
    /// far as the value reaches (empty past its end), reading only those (and what
    /// checks them).
    fn read_part(&self, reference: &[u8], offset: u64, len: usize, out: &mut Vec<u8>)
    -> Result<()>;
    /// The value `reference` names is now referenced by the record of `key` that was
    /// just placed (the caller holds the record's page lock).
    fn applied(&self, reference: &[u8], key: &[u8]);
    /// The value `reference` names is no longer reachable through `key`: a newer version
    /// of the key shadows the record that referenced it.
    fn replaced(&self, reference: &[u8], key: &[u8]);
    /// A guard under which a reference found in the tree stays readable: taken before
    /// the lookup, dropped after the value is read. `None` while the store has never
    /// held a value (no reference can be found then).
    fn guard(&self) -> Option<ReadGuard>;
    /// Whether the store ever held a value: until it does, no record references one,
    /// and writes and merges need not look for references to report.
    fn holds_values(&self) -> bool;
    /// The keyspace was dropped from its database and its tree is gone: no record of
    /// it is read or written again, and every value it references is unreachable.
    fn keyspace_dropped(&self);
}

/// References to values that were made unreachable, collected while a page is being
/// rewritten and handed to the store afterwards ([`Core::release_replaced`]).
#[derive(Default)]
pub(super) struct Replaced {
    refs: Vec<Unreachable>,
}

/// A reference to a value made unreachable, and the key whose record held it.
struct Unreachable {
    reference: Box<[u8]>,
    key: Box<[u8]>,
}

impl Replaced {
    /// Notes that the record of `key` holding `old` (of type `old_type`) is shadowed by
    /// a newer version holding `new` (of type `new_type`): if the old one referenced a
    /// value and the new one references another (or none), that value is unreachable.
    pub(super) fn note(
        &mut self,
        key: &[u8],
        (old_type, old): (super::node::RecordType, &[u8]),
        (new_type, new): (super::node::RecordType, &[u8]),
    ) {
        if old_type.is_external() && !(new_type.is_external() && new == old) {
            self.refs.push(Unreachable {
                reference: old.into(),
                key: key.into(),
            });
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }
}

impl Core {
    /// Whether a record of the tree may reference a value kept out of line: it has a
    /// store, and the store ever held a value. Writes and merges look for shadowed
    /// references only then, so trees of short values pay nothing for them.
    pub(super) fn may_hold_external(&self) -> bool {
        self.values.get().is_some_and(|v| v.holds_values())
    }

    /// The value store's read guard, if the tree has a store that holds values.
    pub(super) fn value_guard(&self) -> Option<ReadGuard> {
        self.values.get().and_then(|v| v.guard())
    }

    /// Turns what a read found into the value in `out`: reads an out-of-line value in
    /// place of its reference. Whether the key exists.
    pub(super) fn resolve(&self, found: Found, out: &mut Vec<u8>) -> Result<bool> {
        match found {
            Found::Value => Ok(true),
            Found::Absent => Ok(false),
            Found::External => {
                let reference = std::mem::take(out);
                self.host()?.read(&reference, out)?;
                Ok(true)
            }
        }
    }

    /// [`Core::resolve`] for the async API: an out-of-line value is read on the
    /// runtime's ring where the store allows ([`ValueHost::on_ring`]).
    #[cfg(feature = "tokio-uring")]
    pub(super) async fn resolve_on_ring(&self, found: Found, out: &mut Vec<u8>) -> Result<bool> {
        if !matches!(found, Found::External) {
            return self.resolve(found, out);
        }
        let reference = std::mem::take(out);
        match self.host()?.on_ring(&reference)? {
            Some((store, r)) => store.read_on_ring(&r, out).await?,
            None => self.host()?.read(&reference, out)?,
        }
        Ok(true)
    }

    /// Resolves the out-of-line values `get_many` found: `externals` holds each one's
    /// index in `results` and its reference, read all together.
    pub(super) fn resolve_many(
        &self,
        externals: Vec<(usize, Vec<u8>)>,
        results: &mut [Option<Vec<u8>>],
    ) -> Result<()> {
        if externals.is_empty() {
            return Ok(());
        }
        let (at, references): (Vec<usize>, Vec<Vec<u8>>) = externals.into_iter().unzip();
        let mut outs = vec![Vec::new(); references.len()];
        self.host()?.read_many(&references, &mut outs)?;
        for (i, out) in at.into_iter().zip(outs) {
            results[i] = Some(out);
        }
        Ok(())
    }

    /// The value store, which a tree holding an out-of-line value must have.
    pub(super) fn host(&self) -> Result<&Arc<dyn ValueHost>> {
        self.values.get().ok_or_else(|| {
            Error::Unsupported(
                "the tree holds an out-of-line value but has no value store".to_string(),
            )
        })
    }

    /// Tells the store of every value `replaced` collected.
    pub(super) fn release_replaced(&self, replaced: Replaced) {
        if replaced.is_empty() {
            return;
        }
        if let Some(host) = self.values.get() {
            for r in replaced.refs {
                host.replaced(&r.reference, &r.key);
            }
        }
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    //! The tree's side of out-of-line values against a model store: every read resolves
    //! to the value last written, no value is reported unreachable while its key still
    //! holds it, and once the tree is flushed every value written and not current has
    //! been reported (none leaks).

    use std::collections::{BTreeMap, HashMap, HashSet};
    use std::sync::{Arc, Mutex};

    use super::ValueHost;
    use crate::config::Config;
    use crate::error::Result;
    use crate::tree::Tree;
    use crate::tree::node::RecordType;

    /// The model store: values by reference (an 8-byte id), and what the tree said.
    #[derive(Default)]
    struct Model {
        values: HashMap<u64, Vec<u8>>,
        applied: HashSet<u64>,
        replaced: HashSet<u64>,
        /// Each key's current reference, as the test's writes left it.
        current: HashMap<Vec<u8>, u64>,
        /// The write in progress: its key and new reference (its old value may be
        /// reported while it runs).
        writing: Option<(Vec<u8>, Option<u64>)>,
        premature: Vec<String>,
    }

    struct MockHost(Mutex<Model>);

    fn id(reference: &[u8]) -> u64 {
        u64::from_le_bytes(reference.try_into().expect("8-byte references"))
    }

    impl ValueHost for MockHost {
        fn write(&self, _value: &[u8]) -> Result<Vec<u8>> {
            unreachable!("the test writes its references itself")
        }
        fn read(&self, reference: &[u8], out: &mut Vec<u8>) -> Result<()> {
            let m = self.0.lock().unwrap();
            out.extend_from_slice(&m.values[&id(reference)]);
            Ok(())
        }
        fn read_part(&self, r: &[u8], offset: u64, len: usize, out: &mut Vec<u8>) -> Result<()> {
            let m = self.0.lock().unwrap();
            let v = &m.values[&id(r)];
            let start = (offset as usize).min(v.len());
            out.clear();
            out.extend_from_slice(&v[start..(start + len).min(v.len())]);
            Ok(())
        }
        fn applied(&self, reference: &[u8], _key: &[u8]) {
            self.0.lock().unwrap().applied.insert(id(reference));
        }
        fn replaced(&self, reference: &[u8], key: &[u8]) {
            let mut m = self.0.lock().unwrap();
            let r = id(reference);
            let still_current = match &m.writing {
                Some((k, new)) if k.as_slice() == key => *new == Some(r),
                _ => m.current.get(key) == Some(&r),
            };
            if still_current {
                let what = format!("{r} of key {key:?} reported while current");
                m.premature.push(what);
            }
            m.replaced.insert(r);
        }
        fn guard(&self) -> Option<crate::storage::ReadGuard> {
            None
        }
        fn holds_values(&self) -> bool {
            true
        }
        fn keyspace_dropped(&self) {}
    }

    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// Random puts (inline and out of line), deletes and reads over few keys in a small
    /// pool, so that mini-pages grow, merge, split, mirror and are evicted.
    #[test]
    fn out_of_line_values_resolve_and_every_replaced_one_is_reported_once_unreachable() {
        for seed in 1..=4u64 {
            let tree = Tree::in_memory(Config {
                memory_budget_bytes: 256 * 1024,
                background_eviction: false,
                ..Config::default()
            })
            .unwrap();
            let host = Arc::new(MockHost(Mutex::new(Model::default())));
            let _ = tree.core.values.set(host.clone());
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut next_ref = 1u64;
            for step in 0..20_000 {
                let k = format!("key{:05}", xorshift(&mut rng) % 3000).into_bytes();
                match xorshift(&mut rng) % 10 {
                    0..=3 => {
                        let value =
                            vec![(step % 251) as u8; 20 + (xorshift(&mut rng) % 60) as usize];
                        let external = xorshift(&mut rng).is_multiple_of(2);
                        let new_ref = external.then(|| {
                            next_ref += 1;
                            next_ref
                        });
                        {
                            let mut m = host.0.lock().unwrap();
                            m.writing = Some((k.clone(), new_ref));
                            if let Some(r) = new_ref {
                                m.values.insert(r, value.clone());
                            }
                        }
                        let stored = new_ref.map(u64::to_le_bytes);
                        let record = match &stored {
                            Some(r) => (&r[..], RecordType::InsertExternal),
                            None => (&value[..], RecordType::Insert),
                        };
                        tree.core
                            .write_record(&k, Some(record), &mut || Ok(None))
                            .unwrap();
                        let mut m = host.0.lock().unwrap();
                        m.writing = None;
                        match new_ref {
                            Some(r) => m.current.insert(k.clone(), r),
                            None => m.current.remove(&k),
                        };
                        model.insert(k, value);
                    }
                    4..=5 => {
                        host.0.lock().unwrap().writing = Some((k.clone(), None));
                        tree.delete(&k).unwrap();
                        let mut m = host.0.lock().unwrap();
                        m.writing = None;
                        m.current.remove(&k);
                        model.remove(&k);
                    }
                    6 if step % 1000 == 0 => tree.flush().unwrap(),
                    7 if step % 10 == 0 => {
                        let end = format!("key{:05}", xorshift(&mut rng) % 3000).into_bytes();
                        let (lo, hi) = if k <= end { (k, end) } else { (end, k) };
                        let want: Vec<(Vec<u8>, Vec<u8>)> = model
                            .range(lo.clone()..hi.clone())
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        let got: Vec<_> = tree
                            .range(lo.clone()..hi.clone())
                            .map(|r| r.unwrap())
                            .collect();
                        assert_eq!(got, want, "seed {seed} step {step}: range");
                        let mut back: Vec<_> = tree
                            .range(lo.clone()..hi.clone())
                            .rev()
                            .map(|r| r.unwrap())
                            .collect();
                        back.reverse();
                        assert_eq!(back, want, "seed {seed} step {step}: reversed range");
                        let mut cursor = tree.cursor(lo..hi);
                        let mut lent = Vec::new();
                        while let Some(r) = cursor.next() {
                            let (k, v) = r.unwrap();
                            lent.push((k.to_vec(), v.to_vec()));
                        }
                        assert_eq!(lent, want, "seed {seed} step {step}: cursor");
                    }
                    _ => assert_eq!(
                        tree.get(&k).unwrap(),
                        model.get(&k).cloned(),
                        "seed {seed} step {step}"
                    ),
                }
            }
            let many: Vec<&Vec<u8>> = model.keys().take(500).collect();
            let got = tree.get_many(&many).unwrap();
            for (k, v) in many.iter().zip(got) {
                assert_eq!(v.as_ref(), model.get(*k), "get_many of {k:?}");
            }
            tree.flush().unwrap();
            let m = host.0.lock().unwrap();
            assert!(
                m.premature.is_empty(),
                "seed {seed}: {:?}",
                &m.premature[..m.premature.len().min(5)]
            );
            let current: HashSet<u64> = m.current.values().copied().collect();
            let leaked: Vec<u64> = m
                .applied
                .iter()
                .filter(|r| !current.contains(r) && !m.replaced.contains(r))
                .copied()
                .collect();
            assert!(
                leaked.is_empty(),
                "seed {seed}: {} values never reported",
                leaked.len()
            );
            assert!(current.iter().all(|r| m.applied.contains(r)));
            assert!(
                m.applied.len() > 1000,
                "seed {seed}: the test wrote too few values out of line"
            );
        }
    }
}
