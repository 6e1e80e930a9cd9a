//! Eviction from the pool's head (Bf-Tree §4.3): the pool's `Evictor` callback, which
//! merges a dirty mini-page into its leaf page (batched across the claimed blocks) and
//! points the page at its leaf page before the block is reclaimed. Only try-locks.
//!
//! Uses: `merge`, `mini`, `leaf`, `mapping`, `stats`.

use crate::error::Result;
use crate::pool::{Block, EvictDecision, Evictor};
use crate::sync::atomic::Ordering;

use super::leaf::{MINI_HEADER_BYTES, MiniHeader};
use super::mapping::{self, Location};
use super::merge::MergeJob;
use super::mini::{mini_block_bytes, mini_fences};
use super::node;
use super::stats::bump;
use super::{Core, Op};

impl Evictor for Core {
    /// Merges a mini-page at the pool's head into its leaf page and points the mapping
    /// table back at the leaf. Only try-locks: the evicting thread may hold page locks.
    fn evict(&self, block: &Block) -> EvictDecision {
        // SAFETY: the block is `Evicting`: published, and if its page frees it meanwhile
        // it only becomes `Dead`, whose memory is not reused before we return.
        let header = unsafe { MiniHeader::of(block) };
        let Some(page) = self.mapping.try_write(header.pid) else {
            return EvictDecision::Busy;
        };
        if page.location() != Location::Mini(block.offset()) {
            // Between our claim and the lock, the page's owner moved its mini-page
            // (growth, copy-on-access, mirror) or dropped it, and freed this block,
            // which is now `Dead`: the pool reclaims it when we answer `Busy`.
            return EvictDecision::Busy;
        }
        let mini = self.mini_page(&page).expect("checked above").node();
        if !mini.iter().any(|r| r.record_type().is_dirty()) {
            return self.finish_eviction(&page, header, Ok(false));
        }
        if self.failed.load(Ordering::Acquire) {
            return self.keep_in_memory(&page, header);
        }
        let merged = self.merge(header.pid, header, Some(mini), None, false);
        self.finish_eviction(&page, header, merged.map(|m| m.split()))
    }

    /// Evicts several mini-pages with batched IO: the leaf pages their dirty records
    /// merge into are read with one `read_pages` call, and the merged pages written with
    /// one `write_pages` call. A page that must split is written on its own (the split
    /// also changes inner nodes). Only try-locks, like `evict`; the page locks it gets
    /// are held until the batch is written, which delays only readers of those pages.
    fn evict_batch(&self, blocks: &[Block]) -> Vec<EvictDecision> {
        if blocks.len() < 2 || self.counters.single_evictions.load(Ordering::Relaxed) {
            return blocks.iter().map(|b| self.evict(b)).collect();
        }
        let mut decisions = vec![EvictDecision::Busy; blocks.len()];
        // Locked pages whose dirty records must be merged.
        let mut jobs: Vec<(usize, mapping::WriteGuard<'_>, MiniHeader)> = Vec::new();
        for (i, block) in blocks.iter().enumerate() {
            // SAFETY: as in `evict`, the block is `Evicting`.
            let header = unsafe { MiniHeader::of(block) };
            // Two blocks of one page cannot both be its mini-page: the second try-lock
            // fails (we hold the first) and answers `Busy`, as it would alone.
            let Some(page) = self.mapping.try_write(header.pid) else {
                continue;
            };
            if page.location() != Location::Mini(block.offset()) {
                continue;
            }
            let mini = self.mini_page(&page).expect("checked above").node();
            if !mini.iter().any(|r| r.record_type().is_dirty()) {
                decisions[i] = self.finish_eviction(&page, header, Ok(false));
            } else if self.failed.load(Ordering::Acquire) {
                decisions[i] = self.keep_in_memory(&page, header);
            } else {
                jobs.push((i, page, header));
            }
        }
        let batch: Vec<MergeJob<'_>> = jobs
            .iter()
            .map(|(_, page, _)| MergeJob::new(self.mini_page(page).expect("checked above")))
            .collect();
        let merged = self.merge_batch(&batch);
        drop(batch);
        for ((i, page, header), merged) in jobs.into_iter().zip(merged) {
            decisions[i] = self.finish_eviction(&page, header, merged);
        }
        decisions
    }
}

impl Core {
    /// Evicts the mini-page of a poisoned tree, whose dirty records can no longer go to
    /// their leaf page (`Tree` refuses writes once one failed): copies them to a block
    /// at the pool's tail and points the page there, so the pool's head moves on. The
    /// pool may be shared with healthy keyspaces, which must not stall behind a block
    /// that can never be merged; the poisoned tree's reads still find every record. It
    /// takes no new writes, so what it keeps is bounded by what it held when it failed.
    /// If the pool has no free block right now (an evictor must not evict recursively):
    /// a tree on its own answers `Busy` (the block stays and is retried; the pool is its
    /// alone); a keyspace of a `Db` drops the records, since the database's other
    /// keyspaces share the pool and its log can bring them back on reopen. The caller
    /// holds the page's write lock.
    fn keep_in_memory(&self, page: &mapping::WriteGuard<'_>, header: MiniHeader) -> EvictDecision {
        let mini = self.mini_page(page).expect("the caller checked").node();
        let dirty = |r: &node::RecordView<'_>| r.record_type().is_dirty();
        let fences = mini_fences(mini.prefix(), mini.prefix().len());
        let Some(mut moved) = self.try_alloc(mini_block_bytes(&mini, &fences, dirty)) else {
            if !self.drop_when_failed.load(Ordering::Acquire) {
                return EvictDecision::Busy;
            }
            // No room, and other keyspaces need the pool: drop the records. From now on
            // reads that need a leaf page are refused (`parse_leaf`), as a leaf page may
            // lack what was dropped. Set before the page lock is released, so a reader
            // that locks the page after us sees it.
            self.dropped_records.store(true, Ordering::Release);
            page.set_location(Location::Leaf(header.leaf.0));
            bump(&self.counters.dropped_after_failure);
            return EvictDecision::Evicted;
        };
        let bytes = moved.bytes_mut();
        MiniHeader {
            mirror: false,
            ..header
        }
        .write(bytes);
        node::copy_into(&mini, &mut bytes[MINI_HEADER_BYTES..], fences, |r| dirty(r))
            .expect("sized for the dirty records");
        self.publish(page, moved);
        bump(&self.counters.kept_after_failure);
        // The old block is the pool's to reclaim once we answer.
        EvictDecision::Evicted
    }

    /// Ends the eviction of a mini-page whose dirty records `merged` went (or failed to
    /// go) to the leaf page: on success points the page at its leaf page and answers
    /// `Evicted`; on failure records an operating error and answers `Busy`, so the dirty
    /// records stay in memory. The caller holds the page's write lock.
    pub(super) fn finish_eviction(
        &self,
        page: &mapping::WriteGuard<'_>,
        header: MiniHeader,
        merged: Result<bool, Op>,
    ) -> EvictDecision {
        match merged {
            Ok(_) => {
                page.set_location(Location::Leaf(header.leaf.0));
                bump(&self.counters.evictions);
                EvictDecision::Evicted
            }
            Err(Op::Fail(e)) => {
                // The dirty records stay in memory; writers that need room, of any tree
                // in the pool, learn why.
                self.pool.note_evict_failure(&e);
                EvictDecision::Busy
            }
            Err(Op::Restart) | Err(Op::WouldBlock) => EvictDecision::Busy,
        }
    }
}
