//! The sync protocol of a file store: the commit of a new free-list chain and
//! superblock, and the crash points tests stop it at.
//!
//! # Invariants this module owns
//!
//! - A sync writes the new chain only into slots the durable state calls free or that
//!   lie past its high-water mark, `fdatasync`s, then writes the superblock copy that the
//!   newest durable superblock does not occupy, and `fdatasync`s again. The superblock
//!   write is the commit point (see the parent module's crash argument).
//! - Syncs are serialized: one plan is committed before the next is made.
//! - The pages of the chain a superblock replaces become free only once that superblock
//!   is durable.

use std::io;
use std::os::unix::fs::FileExt;

use super::super::{PAGE_HEADER_SIZE, Page};
use super::freelist::{AllocState, FREE_LIST_ENTRIES_PER_PAGE, encode_page};
use super::superblock::Superblock;
use super::{FileStore, offset_of};
use crate::sync::atomic::Ordering;

/// Where a test wants the next sync to stop, simulating a crash of the process there.
///
/// The sync returns an error at that point, which poisons the store; the test then
/// drops it and reopens the file to check what the durable state is.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SyncCrashPoint {
    /// Run syncs to completion.
    None = 0,
    /// Stop after writing the new free-list chain, before the first fsync.
    AfterFreeList = 1,
    /// Stop after the first fsync, before writing the superblock.
    BeforeSuperblock = 2,
    /// Write only the page header of the new superblock over the old copy, then stop:
    /// a torn write.
    TornSuperblock = 3,
}

/// What a sync will write, decided under the state lock and written without it.
struct SyncPlan {
    /// The new chain's pages, in chain order.
    chain: Vec<u64>,
    /// Every free page number the new chain lists, sorted.
    entries: Vec<u64>,
    superblock: Superblock,
    /// The chain the new superblock replaces; freed when it is durable.
    old_chain: Vec<u64>,
}

impl FileStore {
    /// Makes the next sync stop at `point`, as if the process crashed there, so tests
    /// can check the crash argument of the sync protocol.
    #[doc(hidden)]
    pub fn set_sync_crash_point_for_test(&self, point: SyncCrashPoint) {
        self.crash_point.store(point as u8, Ordering::Release);
    }

    /// Fails with a simulated crash if a test asked for one at `point`.
    fn crash_here(&self, point: SyncCrashPoint) -> io::Result<()> {
        if self.crash_point.load(Ordering::Acquire) == point as u8 {
            self.crash_point
                .store(SyncCrashPoint::None as u8, Ordering::Release);
            return Err(io::Error::other(format!("simulated crash at {point:?}")));
        }
        Ok(())
    }

    /// [`PageStore::sync`](super::super::PageStore::sync) of a file store.
    pub(super) fn sync_store(&self) -> io::Result<()> {
        self.poison.check()?;
        let _serial = self.sync_lock.lock();
        self.poison.check()?;
        let plan = {
            let mut st = self.state.write();
            if st.dirty {
                Some(
                    self.plan_sync(&mut st)
                        .map_err(|e| self.poison.poison(self.at_path(e)))?,
                )
            } else {
                None
            }
        };
        let Some(plan) = plan else {
            // The allocation state on disk is current; only data writes need flushing.
            return self
                .file
                .sync_data()
                .map_err(|e| self.poison.poison(self.at_path(e)));
        };
        self.execute_sync(&plan)
            .map_err(|e| self.poison.poison(self.at_path(e)))?;
        let mut st = self.state.write();
        for no in &plan.old_chain {
            let was_withheld = st.withheld.remove(no);
            assert!(was_withheld, "old free-list page {no} was withheld");
            st.free_durable.insert(*no);
        }
        st.chain = plan.chain.clone();
        st.generation = plan.superblock.generation;
        Ok(())
    }

    /// Decides the new free-list chain and superblock, under the state lock.
    fn plan_sync(&self, st: &mut AllocState) -> io::Result<SyncPlan> {
        let per_page = FREE_LIST_ENTRIES_PER_PAGE;
        let mut entry_count = st.free_recent.len() + st.free_durable.len() + st.chain.len();
        let mut chain = Vec::new();
        let mut new_high_water = st.high_water;
        while chain.len() * per_page < entry_count {
            // A chain page taken from the free slots no longer needs an entry; one past
            // the high-water mark never had one.
            if let Some(no) = st.free_durable.pop_first() {
                entry_count -= 1;
                chain.push(no);
            } else {
                chain.push(new_high_water);
                new_high_water += 1;
            }
        }
        self.ensure_len(st, new_high_water)?;
        st.high_water = new_high_water;
        st.withheld.extend(chain.iter().copied());

        let mut entries: Vec<u64> = st
            .free_durable
            .iter()
            .chain(st.free_recent.iter())
            .chain(st.chain.iter())
            .copied()
            .collect();
        entries.sort_unstable();
        assert_eq!(entries.len(), entry_count);
        assert!(entries.len() <= chain.len() * per_page);

        // Slots freed since the last sync are free in the superblock being written.
        // Until it is durable no other chain is planned (syncs are serialized), and if
        // it never becomes durable the store is poisoned and plans nothing more.
        let mut recent = std::mem::take(&mut st.free_recent);
        st.free_durable.append(&mut recent);
        st.durable_high_water = new_high_water;
        st.dirty = false;

        let superblock = Superblock {
            generation: st.generation + 1,
            high_water: new_high_water,
            free_head: chain.first().copied().unwrap_or(0),
            free_count: entries.len() as u64,
            free_list_pages: chain.len() as u64,
        };
        debug_assert!(superblock.validate(superblock.slot()).is_ok());
        Ok(SyncPlan {
            chain,
            entries,
            superblock,
            old_chain: st.chain.clone(),
        })
    }

    /// Writes the planned chain and superblock with the two fsyncs of the protocol.
    fn execute_sync(&self, plan: &SyncPlan) -> io::Result<()> {
        let mut page = Page::boxed();
        let mut chunks = plan.entries.chunks(FREE_LIST_ENTRIES_PER_PAGE);
        for (i, &no) in plan.chain.iter().enumerate() {
            let entries = chunks.next().unwrap_or(&[]);
            let next = plan.chain.get(i + 1).copied().unwrap_or(0);
            encode_page(&mut page, next, entries, plan.superblock.generation);
            self.file.write_all_at(page.as_bytes(), offset_of(no))?;
        }
        assert!(chunks.next().is_none(), "the chain holds every entry");
        self.crash_here(SyncCrashPoint::AfterFreeList)?;
        // Data pages, the new chain and the file length become durable before the
        // superblock that points at them.
        self.file.sync_data()?;
        self.crash_here(SyncCrashPoint::BeforeSuperblock)?;
        let sb_page = plan.superblock.to_page();
        let slot = plan.superblock.slot();
        if self.crash_here(SyncCrashPoint::TornSuperblock).is_err() {
            // Only the new header lands on the old copy. (A tear at a later byte would
            // mostly reproduce the new page, since both copies are zero past their
            // fields.) A part-page write is not valid under O_DIRECT, so the tear goes
            // through a read-modify-write of the whole page.
            let mut torn = Page::boxed();
            self.file
                .read_exact_at(torn.as_bytes_mut(), offset_of(slot))?;
            torn.as_bytes_mut()[..PAGE_HEADER_SIZE]
                .copy_from_slice(&sb_page.as_bytes()[..PAGE_HEADER_SIZE]);
            self.file.write_all_at(torn.as_bytes(), offset_of(slot))?;
            return Err(io::Error::other(
                "simulated crash in the middle of a superblock write",
            ));
        }
        self.file
            .write_all_at(sb_page.as_bytes(), offset_of(slot))?;
        self.file.sync_data()
    }
}
