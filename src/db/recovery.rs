//! Recovery: opening a database (`Db::open_on`), in the order it happens — the
//! directory locked and its manifest read; the checkpoints it names loaded, a damaged
//! one skipped; the log opened at the chosen one's position and checked to reach what
//! the checkpoints need; the manifest rewritten first if a checkpoint was skipped; every
//! keyspace restored from its checkpoint; the log replayed; stale files removed; and a
//! checkpoint if anything was replayed. The argument is in `docs/design.md`, "Recovery
//! on open".

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::journal::Journal;
use crate::storage::values::Uncertain;
use crate::storage::{
    BlockDevice, LOG_BLOCK_BYTES, LogDevice, PAGE_SIZE, PinSet, ValueRef, ValueStore, value_files,
};
use crate::sync::atomic::AtomicU8;
use crate::tree::{Stored, TreeMemory};
use crate::wal::{self, LogOp, LogOptions, LogPosition};

use super::catalog::{Catalog, Keyspace, hash_grants};
use super::checkpoint::Checkpoint;
use super::checkpointer::{self, CheckpointCrashPoint, Checkpoints, Kept, Merge, kept_floors};
use super::dir::{
    LOCK, Pages, VALUE_FILE, checkpoint_path, create_manifest, lock_dir, no_database,
};
use super::manifest::{CheckpointRef, KeyspaceKind, Manifest};
use super::memory::Budget;
use super::{Db, DbOptions, DbStats, LostLog, RecoveryStats, Shared};

impl Db {
    pub(super) fn open_on(
        dir: &Path,
        options: DbOptions,
        device: Arc<dyn LogDevice>,
        pages: Pages,
    ) -> Result<Db> {
        let started = Instant::now();
        options.validate()?;
        if !dir.is_dir() {
            return Err(no_database(dir));
        }
        let (lock, lock_created) = lock_dir(dir)?;
        let manifest = match Manifest::load(dir)? {
            Some(m) => m,
            None => match create_manifest(dir, &options, &*device) {
                Ok(m) => m,
                Err(e) => {
                    // Refused: the directory is left as it was found.
                    if lock_created {
                        let _ = std::fs::remove_file(dir.join(LOCK));
                    }
                    return Err(e);
                }
            },
        };
        let (manifest, raised) = check_limits(dir, manifest, &options.config)?;
        let newest_named = manifest.checkpoints.first().map_or(0, |c| c.generation);
        let mut recovery = RecoveryStats::default();
        let loaded = load_checkpoints(dir, &manifest, &mut recovery)?;
        let position = loaded
            .first()
            .map_or(LogPosition::default(), |c| c.position);
        let log_options = LogOptions {
            segment_blocks: options.log_segment_bytes / LOG_BLOCK_BYTES as u64,
            ..LogOptions::default()
        };
        let (log, recovered) =
            wal::open_at(device, log_options, position).map_err(|e| log_damage(dir, e))?;
        check_log_reaches(
            dir,
            &manifest,
            loaded.first(),
            &recovered.records,
            options.accept_rollback,
            &mut recovery,
        )?;
        // Manifest first: a checkpoint recovery skipped is not pinned, so replay,
        // eviction and every later write may reuse its page slots (and its hash logs'
        // addresses). Before anything can, the manifest stops naming it, durably: a
        // crash or a failure of this open then leaves a manifest whose checkpoints are
        // intact, and no later open loads pages that were overwritten.
        // A rollback the options accepted is recorded the same way: the checkpoints'
        // durable ends come down to what the log holds, so that the next open does not
        // ask again for records that are gone (the log continues from where it ends).
        let mut manifest = manifest;
        if loaded.len() < manifest.checkpoints.len() || recovery.rolled_back.is_some() {
            // A kept checkpoint's recovery still needs the log through the skipped
            // one's durable end: that is what its durable end becomes.
            let needed_end = manifest.checkpoints.first().map_or(0, |r| r.log_end_seq);
            manifest.checkpoints = manifest
                .checkpoints
                .iter()
                .filter(|r| loaded.iter().any(|c| c.generation == r.generation))
                .map(|r| CheckpointRef {
                    log_end_seq: match recovery.rolled_back {
                        None => r.log_end_seq.max(needed_end),
                        Some(lost) => r.log_end_seq.min(lost.found_end_seq),
                    }
                    .max(r.position.seq),
                    ..*r
                })
                .collect();
            manifest.store(dir)?;
        }
        recovery.log_bytes =
            recovered.next_block.saturating_sub(position.block) * LOG_BLOCK_BYTES as u64;
        recovery.discarded_bytes = recovered.discarded_bytes;
        recovery.discarded_records = recovered.discarded_records;
        let journal = Arc::new(Journal::new(lock, Arc::new(log), options.flush_interval));
        // Past every generation the manifest named at the open, a damaged one skipped
        // too: its file is left in place, never overwritten by a new checkpoint.
        let next_generation = newest_named + 1;
        let (values, uncertain) =
            open_values(dir, &pages, &options, loaded.first(), next_generation)?;
        // The WAL rule for values: no group of log records is written before the values
        // its records may reference are durable.
        let synced = Arc::clone(&values);
        journal.log().set_before_group(Box::new(move || {
            synced.sync().map_err(|e| match e {
                Error::Io(e) => e,
                e => io::Error::other(e.to_string()),
            })
        }));
        let memory = TreeMemory::new(&options.config)?;
        let budget = Arc::new(Budget::new(
            memory.clone(),
            Arc::clone(values.cache()),
            options.config.value_cache_percent,
        ));
        // The cache may have a share of the budget once the store holds a value: now,
        // if the checkpoint's store does; else from the first write or replayed value
        // (`Shared::rebalance_memory` sets it, by the bytes stored).
        let weak = Arc::downgrade(&budget);
        values.on_first_value(Box::new(move || {
            if let Some(budget) = weak.upgrade() {
                budget.values_held();
            }
        }));
        if values.holds_values() {
            budget.values_held();
        }
        let mut shared = Shared {
            dir: dir.to_path_buf(),
            options,
            memory,
            budget,
            pages,
            journal,
            catalog: RwLock::new(Catalog {
                manifest: manifest.clone(),
                keyspaces: HashMap::new(),
                dropped: HashMap::new(),
            }),
            checkpoints: Mutex::new(Checkpoints {
                kept: Vec::new(),
                next_generation,
                quiesced: (0, LogPosition::default()),
                trigger_from: loaded.first().map_or(0, |c| c.position.block),
                stats: DbStats {
                    checkpoint_generation: loaded.first().map_or(0, |c| c.generation),
                    ..DbStats::default()
                },
                last_at: Instant::now(),
            }),
            recovery: RecoveryStats::default(),
            crash_point: AtomicU8::new(CheckpointCrashPoint::None as u8),
            values,
        };
        shared.restore(&manifest, &loaded, &mut recovery)?;
        shared.free_dropped_values(&manifest);
        shared.replay(&recovered.records, &mut recovery)?;
        shared.settle_values(uncertain)?;
        shared.resume_hash_compactors();
        // Epoch 0's writes come after the replay: every record they append is at or
        // past the log's position now. (Replayed writes are stamped unlogged, so the
        // first checkpoint merges them.)
        shared.checkpoints.get_mut().quiesced =
            (shared.journal.epoch(), shared.journal.log().position());
        // The newest checkpoint any manifest committed: files above it never were.
        let committed = newest_named;
        if raised {
            // Larger limits are recorded (durably, before a write can use them) only
            // once the database has validated.
            manifest.store(dir)?;
            shared.catalog.get_mut().manifest = manifest.clone();
        }
        shared.remove_stale_files(&manifest, committed)?;
        recovery.duration = started.elapsed();
        log::info!(
            "bfdb: opened {} in {:?}: checkpoint {}, {} log records replayed ({} bytes), {} \
             torn-tail bytes discarded",
            shared.dir.display(),
            recovery.duration,
            recovery.checkpoint,
            recovery.records_replayed,
            recovery.log_bytes,
            recovery.discarded_bytes
        );
        let replayed = recovery.records_replayed > 0 || recovery.discarded_bytes > 0;
        shared.recovery = recovery;
        // What was replayed (and a torn tail) goes behind a checkpoint at once: a crash
        // soon after does not replay it again, and the torn tail is never counted twice.
        if replayed && let Err(e) = shared.checkpoint(Merge::All) {
            log::warn!(
                "bfdb: the checkpoint after recovery failed (the log still holds everything): {e}"
            );
        }
        for ks in shared.catalog.get_mut().keyspaces.values() {
            if let Keyspace::Tree { tree, .. } = ks {
                tree.set_flush_on_drop(true);
            }
        }
        // The value cache's share of the budget, by what the database holds.
        shared.rebalance_memory();
        let shared = Arc::new(shared);
        let checkpointer = checkpointer::start(&shared);
        Ok(Db {
            shared,
            checkpointer,
            closed: false,
        })
    }
}

/// Refuses options whose key or value limit is below what the database may hold, or
/// whose leaf page size is not its trees'; with larger limits, returns the manifest
/// recording them and `true` (the caller stores it).
fn check_limits(dir: &Path, mut manifest: Manifest, config: &Config) -> Result<(Manifest, bool)> {
    for (name, entry) in &manifest.keyspaces {
        if let KeyspaceKind::Tree { leaf_pages } = entry.kind {
            let bytes = usize::from(leaf_pages) * PAGE_SIZE;
            if bytes != config.leaf_page_size_bytes {
                return Err(Error::Incompatible {
                    reason: format!(
                        "{}: keyspace {name:?} has leaf pages of {bytes} bytes, but these \
                         options ask for {}: open it with leaf_page_size_bytes = {bytes}",
                        dir.display(),
                        config.leaf_page_size_bytes
                    ),
                });
            }
        }
    }
    let (key, value) = (config.max_key_bytes as u64, config.max_value_bytes as u64);
    if key < u64::from(manifest.max_key_bytes) || value < u64::from(manifest.max_value_bytes) {
        return Err(Error::InvalidConfig(format!(
            "{} holds keys of up to {} bytes and values of up to {} bytes; these options \
             allow {key} and {value}: open it with limits at least those",
            dir.display(),
            manifest.max_key_bytes,
            manifest.max_value_bytes
        )));
    }
    let raised =
        key > u64::from(manifest.max_key_bytes) || value > u64::from(manifest.max_value_bytes);
    if raised {
        manifest.max_key_bytes = u32::try_from(key).unwrap_or(u32::MAX);
        manifest.max_value_bytes = u32::try_from(value).unwrap_or(u32::MAX);
    }
    Ok((manifest, raised))
}

/// The checkpoints the manifest names that validate, newest first: the first is the
/// one recovery loads.
///
/// A checkpoint whose file is proven damaged — missing, failing its checksum or its
/// decoding, or disagreeing with the manifest — is skipped with a warning and
/// counted; if none validates although some are named, that is an error. Any other
/// failure to read one (an IO error: a read that may succeed later) fails the open,
/// so that a transient fault never makes recovery give a checkpoint up.
fn load_checkpoints(
    dir: &Path,
    manifest: &Manifest,
    recovery: &mut RecoveryStats,
) -> Result<Vec<Checkpoint>> {
    let mut loaded = Vec::new();
    let mut first_error = None;
    for r in &manifest.checkpoints {
        let checked = Checkpoint::load(dir, r.generation).and_then(|c| {
            if c.position == r.position {
                Ok(c)
            } else {
                Err(Error::CorruptFile {
                    path: checkpoint_path(dir, r.generation),
                    reason: format!(
                        "its log position {:?} is not the manifest's {:?}",
                        c.position, r.position
                    ),
                })
            }
        });
        match checked {
            Ok(c) => loaded.push(c),
            Err(e) if is_damage(&e) => {
                log::warn!(
                    "bfdb: checkpoint {} is damaged, falling back: {e}",
                    r.generation
                );
                if loaded.is_empty() {
                    recovery.checkpoint_fallbacks += 1;
                }
                recovery.damaged_checkpoints.push(e.to_string());
                first_error.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if loaded.is_empty()
        && let Some(e) = first_error
    {
        return Err(e);
    }
    Ok(loaded)
}

/// Whether `e`, from loading a checkpoint file, proves the file damaged for good (so
/// that recovery may fall back past it) rather than reporting a fault of the moment.
fn is_damage(e: &Error) -> bool {
    match e {
        Error::CorruptFile { .. } => true,
        Error::Io(io) => io.kind() == io::ErrorKind::NotFound,
        _ => false,
    }
}

/// An error reading the log back: damage (`InvalidData`) is reported as every damaged
/// file of the directory is, as [`Error::CorruptFile`]; other errors as they are.
fn log_damage(dir: &Path, e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::InvalidData {
        Error::CorruptFile {
            path: dir.to_path_buf(),
            reason: format!("its write-ahead log (wal-*.log) does not validate: {e}"),
        }
    } else {
        Error::from(e)
    }
}

/// Checks that the log recovery read reaches as far as the checkpoints need: from the
/// loaded checkpoint's position to the durable end the newest checkpoint the manifest
/// names recorded when it committed (every record in between was durable then, so a
/// log without them lost them). A log that falls short is an error naming the missing
/// records, unless `accept` (then `recovery` records the loss).
fn check_log_reaches(
    dir: &Path,
    manifest: &Manifest,
    loaded: Option<&Checkpoint>,
    records: &[wal::LogRecord],
    accept: bool,
    recovery: &mut RecoveryStats,
) -> Result<()> {
    let (Some(newest), Some(from)) = (manifest.checkpoints.first(), loaded) else {
        return Ok(());
    };
    let (first_seq, end_seq) = (from.position.seq, newest.log_end_seq);
    if end_seq <= first_seq {
        return Ok(());
    }
    // The records read are contiguous (the reader stops at the first gap), so the log
    // holds the needed range if it starts at its first record and reaches its end.
    let found_end_seq = match records.first() {
        Some(r) if r.seq == first_seq => records.last().map_or(first_seq, |r| r.seq + 1),
        _ => first_seq,
    };
    if found_end_seq >= end_seq {
        return Ok(());
    }
    let lost = LostLog {
        checkpoint: from.generation,
        first_seq,
        end_seq,
        found_end_seq,
    };
    let what = format!(
        "checkpoint {} needs the write-ahead log's records {first_seq} to {} (every one was \
         durable when checkpoint {} committed), but the log holds {}",
        from.generation,
        end_seq - 1,
        newest.generation,
        if found_end_seq == first_seq {
            "none of them".to_string()
        } else {
            format!("only those to {}", found_end_seq - 1)
        }
    );
    if !accept {
        return Err(Error::CorruptFile {
            path: dir.join("wal-*.log"),
            reason: format!(
                "{what}: log segments are missing. Open it with \
                 DbOptions::accept_rollback(true) to accept the older state the files hold"
            ),
        });
    }
    log::warn!(
        "bfdb: {}: {what}; opening the older state as asked",
        dir.display()
    );
    recovery.rolled_back = Some(lost);
    Ok(())
}

impl Shared {
    /// Builds every keyspace of `manifest`: from the newest loaded checkpoint that
    /// records it, or empty.
    fn restore(
        &mut self,
        manifest: &Manifest,
        loaded: &[Checkpoint],
        recovery: &mut RecoveryStats,
    ) -> Result<()> {
        let mut kept: Vec<Kept> = loaded
            .iter()
            .map(|c| Kept {
                generation: c.generation,
                position: c.position,
                pins: HashMap::new(),
                hash: c.hash.iter().copied().collect(),
            })
            .collect();
        // The hash stores' memory comes out of the budget first.
        let recorded: Vec<u64> = manifest
            .keyspaces
            .values()
            .filter_map(|entry| match &entry.kind {
                KeyspaceKind::Hash(layout) => Some(layout.memory_bytes()),
                KeyspaceKind::Tree { .. } => None,
            })
            .collect();
        let mut grants = hash_grants(self.memory.capacity_bytes(), &recorded).into_iter();
        let mut hash_memory = 0;
        // Every kept checkpoint's slots of a keyspace stay pinned.
        let mut keyspaces = HashMap::new();
        for (name, entry) in &manifest.keyspaces {
            if let KeyspaceKind::Hash(layout) = &entry.kind {
                let floors = kept_floors(&kept, entry.id);
                let extents = loaded
                    .first()
                    .and_then(|c| c.hash.iter().find(|(id, _)| *id == entry.id))
                    .map(|(_, e)| (e, floors));
                let memory = grants.next().expect("a grant per hash store");
                hash_memory += memory;
                self.budget.set_hash_bytes(hash_memory);
                let store = self.open_hash_store(name, entry.id, layout, memory, extents, true)?;
                keyspaces.insert(entry.id, Keyspace::Hash(store));
                continue;
            }
            let pinned: Vec<PinSet> = loaded
                .iter()
                .filter_map(|c| {
                    let ks = c.keyspaces.iter().find(|k| k.id == entry.id)?;
                    Some(PinSet {
                        generation: c.generation,
                        slots: ks.leaves.slots().to_vec(),
                    })
                })
                .collect();
            let leaves = loaded
                .first()
                .and_then(|c| c.keyspaces.iter().find(|k| k.id == entry.id));
            let keyspace = self.open_keyspace(name, entry, leaves, &pinned)?;
            if let Keyspace::Tree { tree, .. } = &keyspace {
                // Until the open succeeds: a failed one writes no page on its way out.
                tree.set_flush_on_drop(false);
            }
            recovery.leaf_pages += leaves.map_or(0, |l| l.leaves.len() as u64);
            for (k, set) in kept.iter_mut().zip(loaded) {
                if let Some(p) = pinned.iter().find(|p| p.generation == set.generation) {
                    k.pins.insert(entry.id, p.clone());
                }
            }
            keyspaces.insert(entry.id, keyspace);
        }
        recovery.checkpoint = loaded.first().map_or(0, |c| c.generation);
        self.catalog.get_mut().keyspaces = keyspaces;
        self.checkpoints.get_mut().kept = kept;
        Ok(())
    }

    /// Replays the recovered log records into the keyspaces: each key's last write in
    /// log order, applied in key order (see docs/design.md, "Recovery on open").
    ///
    /// Nothing reads the keyspaces until the open returns, so only each key's final
    /// state must be right, and that is its last write in the log: the earlier ones are
    /// counted as superseded and not applied. Applying in key order visits each leaf
    /// page once for its run of keys instead of once per write (a log replayed in its
    /// own order reads and merges a page per write once the tree outgrows memory).
    fn replay(&self, records: &[wal::LogRecord], recovery: &mut RecoveryStats) -> Result<()> {
        let catalog = self.catalog.read();
        let mut writes: Vec<ReplayWrite<'_>> = Vec::new();
        let mut skipped = 0;
        for op in records.iter().flat_map(|r| &r.ops) {
            let (keyspace, key, value) = match op {
                LogOp::Put {
                    keyspace,
                    key,
                    value,
                } => (*keyspace, &key[..], Some(Stored::Inline(&value[..]))),
                LogOp::Delete { keyspace, key } => (*keyspace, &key[..], None),
                LogOp::PutExternal {
                    keyspace,
                    key,
                    reference,
                } => (*keyspace, &key[..], Some(Stored::External(&reference[..]))),
            };
            let Some(ks) = catalog.keyspaces.get(&keyspace) else {
                skipped += 1;
                continue;
            };
            let inline = match value {
                Some(Stored::Inline(v)) => Some(v),
                _ => None,
            };
            ks.check_record(key, inline).map_err(|e| {
                Error::InvalidConfig(format!(
                    "the log holds a write that these options refuse ({e}); open the \
                     database with limits at least those it was written with"
                ))
            })?;
            writes.push(ReplayWrite {
                keyspace,
                target: ks,
                key,
                order: writes.len(),
                value,
            });
        }
        let replayed = writes.len() as u64;
        // A key's writes sort together, in log order.
        writes.sort_unstable_by(|a, b| {
            (a.keyspace, a.key, a.order).cmp(&(b.keyspace, b.key, b.order))
        });
        let mut applied = 0;
        for (i, w) in writes.iter().enumerate() {
            let last = writes
                .get(i + 1)
                .is_none_or(|next| (next.keyspace, next.key) != (w.keyspace, w.key));
            if last {
                if let Some(Stored::External(reference)) = w.value {
                    // The value's bytes were durable before its record: the extent is
                    // live again, whatever the checkpoint's snapshot said of it.
                    let r = ValueRef::decode(reference).ok_or_else(|| Error::CorruptFile {
                        path: self.dir.clone(),
                        reason: format!(
                            "a log record of keyspace #{} holds a value reference that \
                                 does not decode",
                            w.keyspace
                        ),
                    })?;
                    self.values.mark_live(r, w.keyspace)?;
                }
                w.target.write_unlogged(w.key, w.value)?;
                applied += 1;
            }
        }
        recovery.records_replayed = records.len() as u64;
        recovery.writes_replayed = replayed;
        recovery.writes_superseded = replayed - applied;
        recovery.writes_skipped = skipped;
        Ok(())
    }
}

impl Shared {
    /// Frees the values of the keyspaces `manifest` does not name: a keyspace dropped
    /// after the loaded checkpoint's capture still owns live extents in its snapshot.
    /// No recovery reads its records again (its drop is durable in the manifest and
    /// ids are never reused), so they go the way of any free: deferred, reusable once
    /// the checkpoints kept now are gone (docs/design.md, "Dropped keyspaces").
    fn free_dropped_values(&self, manifest: &Manifest) {
        let named: std::collections::HashSet<u32> =
            manifest.keyspaces.values().map(|e| e.id).collect();
        let freed_bytes = self.values.drop_keyspaces(|k| !named.contains(&k));
        if freed_bytes > 0 {
            log::info!(
                "bfdb: {}: {freed_bytes} bytes of values of dropped keyspaces freed",
                self.dir.display()
            );
        }
    }

    /// Lets the compactor threads of the hash stores the open recovered run: the replay
    /// and the settling of values are done.
    fn resume_hash_compactors(&self) {
        for ks in self.catalog.read().keyspaces.values() {
            if let Keyspace::Hash(store) = ks {
                store
                    .attached()
                    .background_paused
                    .store(false, std::sync::atomic::Ordering::Release);
            }
        }
    }

    /// Settles the extents the loaded checkpoint left uncertain (placed or freed while
    /// it captured the indexes): live if the key's record references the extent now,
    /// after the replay, freed otherwise. Then the store gives back the space no
    /// extent holds, which it kept until the replay had claimed what it needed.
    fn settle_values(&self, uncertain: Vec<Uncertain>) -> Result<()> {
        let catalog = self.catalog.read();
        for u in uncertain {
            let referenced = match catalog.keyspaces.get(&u.keyspace) {
                Some(ks) => ks.references(&u.key, &u.r.encode())?,
                None => false,
            };
            if referenced {
                self.values.mark_live(u.r, u.keyspace)?;
            } else {
                self.values.free(u.r, u.keyspace, &u.key);
            }
        }
        self.values.discard_free()
    }
}

/// The database's value store: restored from the loaded checkpoint's snapshot (with the
/// extents it leaves for recovery to settle), or empty for a database without one.
fn open_values(
    dir: &Path,
    pages: &Pages,
    options: &DbOptions,
    loaded: Option<&Checkpoint>,
    next_generation: u64,
) -> Result<(Arc<ValueStore>, Vec<Uncertain>)> {
    let device: Arc<dyn BlockDevice> = match pages {
        Pages::Files => {
            let direct = !matches!(options.config.backend, crate::config::Backend::Std);
            Arc::new(value_files(dir, direct))
        }
        Pages::Sim(sim) => sim.blocks(VALUE_FILE),
    };
    let (store, uncertain) = match loaded {
        Some(c) if !c.values.is_empty() => {
            let source = checkpoint_path(dir, c.generation);
            ValueStore::restore(device, &source, &c.values)?
        }
        _ => (ValueStore::open(device, next_generation), Vec::new()),
    };
    // Short values are written behind their writers, a sixteenth of the memory budget
    // of them at most (256 KiB to 16 MiB) in memory at once.
    let limit = (options.config.memory_budget_bytes / 16).clamp(256 << 10, 16 << 20);
    let mut store = store.write_behind(limit)?;
    // Writers wait for the background checkpoints that make freed space reusable, if
    // there are any.
    if checkpointer::runs(options) {
        store = store.with_backpressure(checkpointer::VALUE_BACKPRESSURE);
    }
    Ok((Arc::new(store), uncertain))
}

/// One write of the log as recovery replays it (`Shared::replay`).
struct ReplayWrite<'a> {
    keyspace: u32,
    /// The keyspace `keyspace` names.
    target: &'a Keyspace,
    key: &'a [u8],
    /// Its place among the replayed writes, in log order.
    order: usize,
    /// `None` for a delete.
    value: Option<Stored<'a>>,
}
