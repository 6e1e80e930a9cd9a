//! The catalog: the open keyspaces of both kinds (trees over their shadow-paged page
//! files, hash stores over their logs), keyspace creation (durable in the manifest
//! before a write to it can be logged), lookup and drop, and the memory each hash store
//! is granted out of the database's budget (the trees' pool has the rest).

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use crate::config::MIN_MEMORY_BUDGET_BYTES;
use crate::error::{Error, Result};
use crate::hash::checkpoint::F2Extents;
use crate::hash::store::{
    self as hash_store, HashAttached, HashFiles, HashLayout, HashStore, HashStoreOptions,
};
use crate::storage::{ActiveBackend, PAGE_SIZE, PageNo, PinSet, ShadowStore, SlotStore};
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::tree::{Attached, Stored, Tree};

use super::Shared;
use super::checkpoint::KeyspaceLeaves;
use super::dir::{Pages, named, open_page_file, page_file};
use super::manifest::{KeyspaceEntry, KeyspaceKind, MAX_NAME_BYTES, Manifest};
use super::values::KeyspaceValues;

/// One open keyspace.
#[derive(Clone)]
pub(super) enum Keyspace {
    /// A tree and the shadow store under it.
    Tree {
        tree: Arc<Tree>,
        shadow: Arc<ShadowStore>,
    },
    /// A hash store.
    Hash(Arc<HashStore>),
}

impl Keyspace {
    /// Checks a write against the keyspace's limits.
    pub(super) fn check_record(&self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        match self {
            Keyspace::Tree { tree, .. } => tree.check_record(key, value),
            Keyspace::Hash(store) => store.check_record(key, value),
        }
    }

    /// Writes with no log record (recovery's replay, and batches, logged as a whole).
    pub(super) fn write_unlogged(&self, key: &[u8], value: Option<Stored<'_>>) -> Result<()> {
        match (self, value) {
            (Keyspace::Tree { tree, .. }, value) => tree.write_unlogged(key, value),
            (Keyspace::Hash(store), None) => store.write_unlogged(key, None, false),
            (Keyspace::Hash(store), Some(Stored::Inline(v))) => {
                store.write_unlogged(key, Some(v), false)
            }
            (Keyspace::Hash(store), Some(Stored::External(r))) => {
                store.write_unlogged(key, Some(r), true)
            }
        }
    }

    /// Writes `value` (of `key`) to the value store if the keyspace keeps it out of
    /// line; its reference if so.
    pub(super) fn store_value(&self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>> {
        match self {
            Keyspace::Tree { tree, .. } => tree.store_value(value),
            Keyspace::Hash(store) => store.store_value(key, value),
        }
    }

    /// Whether `key`'s records hold the value out of line `reference`, for recovery's
    /// settling of the values a checkpoint left uncertain: a tree's leaf record of the
    /// key references it; any record of a hash store's key holds it (a hash store
    /// frees a value when its last record goes: `F2::report_unreachable`).
    pub(super) fn references(&self, key: &[u8], reference: &[u8]) -> Result<bool> {
        match self {
            Keyspace::Tree { tree, .. } => {
                Ok(tree.stored_reference(key)?.as_deref() == Some(reference))
            }
            Keyspace::Hash(store) => store.holds_reference(key, reference),
        }
    }

    /// Marks the keyspace dropped: its handles refuse writes from now on.
    fn mark_dropped(&self) {
        let dropped = match self {
            Keyspace::Tree { tree, .. } => tree.attached().map(|a| &a.dropped),
            Keyspace::Hash(store) => Some(&store.attached().dropped),
        };
        if let Some(d) = dropped {
            d.store(true, Ordering::Release);
        }
    }
}

/// The keyspaces, by name and by id.
pub(super) struct Catalog {
    pub(super) manifest: Manifest,
    pub(super) keyspaces: HashMap<u32, Keyspace>,
    /// The names of keyspaces dropped since the open, by id: what an error about a
    /// handle to one calls it.
    pub(super) dropped: HashMap<u32, String>,
}

/// The memory each of the hash stores recorded at `recorded` gets out of `budget`:
/// what it recorded, or, if together they would leave the trees less than
/// [`MIN_MEMORY_BUDGET_BYTES`], a share of what the trees leave in proportion to it.
pub(super) fn hash_grants(budget: u64, recorded: &[u64]) -> Vec<u64> {
    let room = budget.saturating_sub(MIN_MEMORY_BUDGET_BYTES);
    let total = recorded.iter().fold(0u64, |sum, &r| sum.saturating_add(r));
    if total <= room {
        return recorded.to_vec();
    }
    recorded
        .iter()
        .map(|&r| (u128::from(r) * u128::from(room) / u128::from(total)) as u64)
        .collect()
}

/// The memory the open hash stores of `catalog` were given.
pub(super) fn hash_memory_bytes(catalog: &Catalog) -> u64 {
    catalog
        .keyspaces
        .values()
        .map(|ks| match ks {
            Keyspace::Hash(store) => store.memory_budget_bytes(),
            Keyspace::Tree { .. } => 0,
        })
        .sum()
}

impl Shared {
    pub(super) fn tree(&self, name: &str) -> Result<Arc<Tree>> {
        match self.keyspace(name, None)? {
            Keyspace::Tree { tree, .. } => Ok(tree),
            Keyspace::Hash(_) => Err(wrong_kind(name, "a hash store", "Db::hash_store")),
        }
    }

    pub(super) fn hash_store(
        &self,
        name: &str,
        options: HashStoreOptions,
    ) -> Result<Arc<HashStore>> {
        match self.keyspace(name, Some(options))? {
            Keyspace::Hash(store) => Ok(store),
            Keyspace::Tree { .. } => Err(wrong_kind(name, "a tree", "Db::tree")),
        }
    }

    /// Keyspace `name`, created if there is none: a hash store with `hash` options if
    /// they are given, else a tree.
    fn keyspace(&self, name: &str, hash: Option<HashStoreOptions>) -> Result<Keyspace> {
        if let Some(ks) = self.lookup(name) {
            return Ok(ks);
        }
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(Error::InvalidConfig(format!(
                "keyspace names are 1 to {MAX_NAME_BYTES} bytes; {name:?} has {}",
                name.len()
            )));
        }
        let mut catalog = self.catalog.write();
        if let Some(entry) = catalog.manifest.keyspaces.get(name) {
            return Ok(catalog.keyspaces[&entry.id].clone());
        }
        let budget = self.memory.capacity_bytes();
        let hash_memory = hash_memory_bytes(&catalog);
        let (kind, memory) = match hash {
            Some(options) => {
                let memory = self.hash_memory_for(name, &options, budget, hash_memory)?;
                let c = &self.options.config;
                // The largest record: a header, the longest key and the longest value a
                // hash store keeps inline (longer ones are out of line: a reference).
                let record = 16 + c.max_key_bytes as u64 + c.inline_value_limit() as u64;
                let layout = HashLayout::new(options.memory_bytes(memory), record)?;
                (KeyspaceKind::Hash(layout), memory)
            }
            None => {
                let leaf_pages = self.options.config.leaf_page_size_bytes / PAGE_SIZE;
                let leaf_pages = u8::try_from(leaf_pages).expect("at most 8 pages");
                (KeyspaceKind::Tree { leaf_pages }, 0)
            }
        };
        let entry = KeyspaceEntry {
            id: catalog.manifest.next_id,
            kind,
        };
        let next_id = entry.id.checked_add(1).ok_or_else(|| {
            Error::Unsupported("the database has used all 2^32 keyspace ids".into())
        })?;
        let keyspace = match &entry.kind {
            KeyspaceKind::Tree { .. } => self.open_keyspace(name, &entry, None, &[])?,
            KeyspaceKind::Hash(layout) => {
                let store = self.open_hash_store(name, entry.id, layout, memory, None, false)?;
                // The trees and the value cache give up the store's memory (the pool
                // evicts down to its share, the cache at once).
                self.budget.set_hash_bytes(hash_memory + memory);
                Keyspace::Hash(store)
            }
        };
        let mut manifest = catalog.manifest.clone();
        manifest.next_id = next_id;
        manifest.keyspaces.insert(name.to_string(), entry.clone());
        // Durable before the first write to it can be logged.
        manifest.store(&self.dir)?;
        catalog.manifest = manifest;
        catalog.keyspaces.insert(entry.id, keyspace.clone());
        Ok(keyspace)
    }

    /// The memory a new hash store `name` with `options` gets out of `budget`, of
    /// which the open hash stores have `hash_memory`: what it asks for, or half of what
    /// is left; an error if that leaves the trees less than they need.
    fn hash_memory_for(
        &self,
        name: &str,
        options: &HashStoreOptions,
        budget: u64,
        hash_memory: u64,
    ) -> Result<u64> {
        let left = budget.saturating_sub(hash_memory + MIN_MEMORY_BUDGET_BYTES);
        let memory = options.memory_bytes.unwrap_or(left / 2);
        if memory > left || memory < hash_store::MIN_MEMORY_BYTES {
            return Err(Error::InvalidConfig(format!(
                "hash store {name:?} needs {memory} bytes of memory (at least {}), but the \
                 database's memory budget of {budget} bytes has {left} left: its hash \
                 stores take {hash_memory} and its trees keep at least \
                 {MIN_MEMORY_BUDGET_BYTES}. Open the database with a larger \
                 config.memory_budget_bytes, or give the store less memory_bytes",
                hash_store::MIN_MEMORY_BYTES
            )));
        }
        Ok(memory)
    }

    fn lookup(&self, name: &str) -> Option<Keyspace> {
        let catalog = self.catalog.read();
        let entry = catalog.manifest.keyspaces.get(name)?;
        catalog.keyspaces.get(&entry.id).cloned()
    }

    /// Drops keyspace `name` if it is of the kind `hash` says; `false` if there is none.
    pub(super) fn drop_keyspace(&self, name: &str, hash: bool) -> Result<bool> {
        let mut catalog = self.catalog.write();
        let Some(entry) = catalog.manifest.keyspaces.get(name).cloned() else {
            return Ok(false);
        };
        match (&entry.kind, hash) {
            (KeyspaceKind::Tree { .. }, true) => {
                return Err(wrong_kind(name, "a tree", "Db::drop_tree"));
            }
            (KeyspaceKind::Hash(_), false) => {
                return Err(wrong_kind(name, "a hash store", "Db::drop_hash_store"));
            }
            _ => {}
        }
        let mut manifest = catalog.manifest.clone();
        manifest.keyspaces.remove(name);
        manifest.store(&self.dir)?;
        catalog.manifest = manifest;
        if let Some(ks) = catalog.keyspaces.remove(&entry.id) {
            ks.mark_dropped();
        }
        catalog.dropped.insert(entry.id, name.to_string());
        if hash {
            // Its memory goes back to the trees and the value cache (once the last
            // handle to it is gone, the store's own memory is freed).
            self.budget.set_hash_bytes(hash_memory_bytes(&catalog));
            // Handles to it still read: only the files' names go; an open file lives on.
            return self.remove_hash_files(entry.id).map(|()| true);
        }
        match &self.pages {
            Pages::Files => {
                let path = self.dir.join(page_file(entry.id));
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::Io(named(&path, e))),
                }
            }
            Pages::Sim(sim) => sim.remove(&page_file(entry.id)),
        }
        Ok(true)
    }

    /// Opens keyspace `entry`'s page file and builds its tree: from `leaves` (a
    /// checkpoint's record of it) with the slots of `pinned` kept, or empty.
    pub(super) fn open_keyspace(
        &self,
        name: &str,
        entry: &KeyspaceEntry,
        leaves: Option<&KeyspaceLeaves>,
        pinned: &[PinSet],
    ) -> Result<Keyspace> {
        let config = self.options.config.clone();
        if let (Pages::Files, Some(ks)) = (&self.pages, leaves) {
            // A checkpoint's pages must be there: a missing or cut page file is an
            // error, never a keyspace read as empty.
            let path = self.dir.join(page_file(entry.id));
            let len = std::fs::metadata(&path).map_or(0, |m| m.len());
            let need = ks
                .leaves
                .slots()
                .iter()
                .map(|slot| slot.saturating_add(1))
                .max()
                .unwrap_or(0)
                .saturating_mul(4096);
            if len < need {
                return Err(Error::CorruptFile {
                    path,
                    reason: format!(
                        "{len} bytes, but the checkpoint records pages up to byte {need} \
                         (missing or truncated)"
                    ),
                });
            }
        }
        let (slots, backend): (Arc<dyn SlotStore>, ActiveBackend) = match &self.pages {
            Pages::Files => {
                let (store, backend) = open_page_file(&self.dir.join(page_file(entry.id)), &config)
                    .map_err(|e| self.page_file_error(name, entry.id, e))?;
                (Arc::new(store), backend)
            }
            Pages::Sim(sim) => (sim.store(&page_file(entry.id)), ActiveBackend::custom()),
        };
        let (shadow, tree) = match leaves {
            Some(ks) => {
                let (shadow, logical) = ShadowStore::recover(slots, ks.leaves.slots(), pinned)
                    .map_err(|e| Error::CorruptFile {
                        path: self.dir.join(page_file(entry.id)),
                        reason: format!("its checkpoint's page slots: {e}"),
                    })?;
                let shadow = Arc::new(shadow);
                // A leaf is its first page's logical number (its pages follow it).
                let list: Vec<(Vec<u8>, PageNo)> = ks
                    .leaves
                    .iter()
                    .map(|(low, _)| low.to_vec())
                    .zip(logical.into_iter().step_by(ks.leaves.pages()))
                    .collect();
                let tree = Tree::from_leaves(
                    config,
                    Box::new(Arc::clone(&shadow)),
                    backend,
                    list,
                    Some(self.memory.clone()),
                )?;
                (shadow, tree)
            }
            None => {
                let shadow = Arc::new(ShadowStore::new(slots)?);
                let tree = Tree::with_store_in(
                    config,
                    Box::new(Arc::clone(&shadow)),
                    backend,
                    self.memory.clone(),
                )?;
                (shadow, tree)
            }
        };
        let tree = tree.attach(Attached {
            journal: Arc::clone(&self.journal),
            keyspace: entry.id,
            name: name.to_string(),
            pages: self.dir.join(page_file(entry.id)),
            durability: self.options.durability,
            dropped: AtomicBool::new(false),
            values: Arc::new(KeyspaceValues {
                store: Arc::clone(&self.values),
                keyspace: entry.id,
            }),
        });
        Ok(Keyspace::Tree {
            tree: Arc::new(tree),
            shadow,
        })
    }

    /// An error opening keyspace `name`'s page file, naming the file and the keyspace.
    /// The manifest says the file is this database's, so one without a bfdb
    /// superblock is damaged ([`Error::CorruptFile`], as any damaged file of the
    /// directory), not foreign; one of another format version stays
    /// [`Error::Incompatible`].
    fn page_file_error(&self, name: &str, id: u32, e: Error) -> Error {
        let path = self.dir.join(page_file(id));
        let whose = format!("the page file of keyspace {name:?}");
        match e {
            Error::Corrupted { page, reason } => Error::CorruptFile {
                path,
                reason: format!("{whose}, page {page}: {reason}"),
            },
            Error::Incompatible { reason } if reason.starts_with("not a bfdb file") => {
                Error::CorruptFile {
                    path,
                    reason: format!("{whose}: {reason}"),
                }
            }
            Error::Incompatible { reason } => Error::Incompatible {
                reason: format!("{} ({whose}): {reason}", path.display()),
            },
            Error::Io(io) => Error::Io(named(&path, io)),
            other => other,
        }
    }

    /// Opens hash keyspace `id`: as a checkpoint's `extents` recorded it (with the
    /// floors its kept checkpoints need), or empty — in which case any log files it has
    /// (a crash before a checkpoint recorded it left them) are removed first. If
    /// `recovering`, its compactor waits for [`Shared::resume_hash_compactors`].
    pub(super) fn open_hash_store(
        &self,
        name: &str,
        id: u32,
        layout: &HashLayout,
        memory: u64,
        extents: Option<(&F2Extents, [u64; 3])>,
        recovering: bool,
    ) -> Result<Arc<HashStore>> {
        // Before anything touches its files: a store of an earlier format is refused.
        layout.check_record_format(&self.dir.join(hash_store::file_prefix(id, "*")), name)?;
        if extents.is_none() {
            self.remove_hash_files(id)?;
        }
        let files = match &self.pages {
            Pages::Files => HashFiles::Dir {
                dir: &self.dir,
                direct: !matches!(self.options.config.backend, crate::config::Backend::Std),
            },
            Pages::Sim(sim) => HashFiles::Sim(sim),
        };
        let attached = HashAttached {
            journal: Arc::clone(&self.journal),
            keyspace: id,
            name: name.to_string(),
            durability: self.options.durability,
            dropped: AtomicBool::new(false),
            max_key_bytes: self.options.config.max_key_bytes,
            max_value_bytes: self.options.config.max_value_bytes,
            inline_value_bytes: self.options.config.inline_value_limit(),
            values: Arc::clone(&self.values),
            background_paused: AtomicBool::new(recovering),
        };
        let store =
            HashStore::open(layout, memory, files, extents, attached).map_err(|e| match e {
                Error::Corrupted { reason, .. } => Error::CorruptFile {
                    path: self.dir.join(hash_store::file_prefix(id, "*")),
                    reason,
                },
                Error::InvalidConfig(why) => {
                    Error::InvalidConfig(format!("hash store {name:?}: {why}"))
                }
                other => other,
            })?;
        Ok(Arc::new(store))
    }
}

/// The error for keyspace `name` asked for as the wrong kind.
fn wrong_kind(name: &str, is: &str, use_instead: &str) -> Error {
    Error::InvalidConfig(format!(
        "keyspace {name:?} is {is}: open it with {use_instead}"
    ))
}
