//! `Tree::flush`: every dirty mini-page merged into its leaf page, in batches, so that
//! the page store holds every record. Also the pieces the background evictor's merges
//! share (`dirty_mini`, `merge_locked`, `after_flush_merge`).
//!
//! Uses: `merge`, `mini`, `leaf`, `mapping`.

use crate::error::{Error, Result};

use super::leaf::MiniHeader;
use super::mapping::{self, Location, PageId};
use super::merge::MergeJob;
use super::mini::mark_clean;
use super::{Core, Op};

/// Pages whose dirty mini-pages `flush` merges with one batched read and write.
pub(super) const FLUSH_BATCH_PAGES: usize = 32;

/// What a checkpoint's flush did ([`Core::flush_older`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flushed {
    /// Dirty pages merged into their leaf pages.
    pub(crate) merged: u64,
    /// Dirty pages left dirty.
    pub(crate) left: u64,
    /// The oldest checkpoint epoch among the pages left dirty.
    pub(crate) oldest_left: Option<u64>,
}

impl Core {
    /// Merges every dirty mini-page into its leaf page (see [`Core::flush_older`]).
    pub(super) fn flush(&self) -> Result<()> {
        self.flush_older(None).map(|_| ())
    }

    /// Merges the dirty mini-pages into their leaf pages, and syncs the page store. With
    /// `keep_from` set, a page whose dirty stamp is a logged write of checkpoint epoch
    /// `keep_from` or later stays dirty (the log covers it); every other dirty page is
    /// merged (older logged writes, unlogged ones, unknown stamps). Answers how many
    /// pages it merged and left, and the oldest epoch among those left. Pages found
    /// clean, and pages merged, have their stamps reset.
    pub(super) fn flush_older(&self, keep_from: Option<u64>) -> Result<Flushed> {
        self.check_writable()?;
        let mut flushed = Flushed::default();
        // Visit every page in id order and merge the dirty records of its mini-page into
        // its leaf page, up to `FLUSH_BATCH_PAGES` pages per batched read and write. The
        // first page of a batch is locked waiting (flush then holds no other lock, so
        // this cannot deadlock), the others with try-locks: a page locked elsewhere ends
        // the batch, and the next batch waits for it. Mini-pages stay cached; their
        // merged records become clean copies.
        let high_water = self.mapping.high_water();
        let mut next = 0;
        let mut failure = None;
        while next < high_water && failure.is_none() {
            let mut locked = Vec::new();
            while next < high_water && locked.len() < FLUSH_BATCH_PAGES {
                let pid = PageId(next);
                let page = if locked.is_empty() {
                    self.mapping.write(pid)
                } else {
                    match self.mapping.try_write(pid) {
                        Some(page) => page,
                        None => break,
                    }
                };
                next += 1;
                if self.dirty_mini(&page).is_none() {
                    page.clear_dirty();
                    continue;
                }
                match (page.dirty_stamp().epoch(), keep_from) {
                    (Some(epoch), Some(keep_from)) if epoch >= keep_from => {
                        flushed.left += 1;
                        flushed.oldest_left =
                            Some(flushed.oldest_left.map_or(epoch, |o| o.min(epoch)));
                    }
                    _ => locked.push(page),
                }
            }
            flushed.merged += locked.len() as u64;
            let (headers, merged) = self.merge_locked(&locked);
            let mut again = Vec::new();
            // Every answer is acted on before an error is returned: a page whose leaf
            // split must stop mapping its mini-page.
            for ((mut page, header), merged) in locked.into_iter().zip(headers).zip(merged) {
                match merged {
                    Ok(split) => self.after_flush_merge(&mut page, header, split),
                    // The split could not lock its inner nodes: try again alone.
                    Err(Op::Restart | Op::WouldBlock) => again.push(page.id()),
                    Err(Op::Fail(e)) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            for pid in again {
                if failure.is_none()
                    && let Err(e) = self.flush_page(pid)
                {
                    failure = Some(e);
                }
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        self.check_writable()?;
        self.store.sync().map_err(|e| {
            let e = Error::from(e);
            self.record_failure(&e);
            e
        })?;
        Ok(flushed)
    }

    /// The page's mini-page as a merge job, if it holds dirty records. The caller holds
    /// the page's write lock.
    pub(super) fn dirty_mini<'g>(&self, page: &'g mapping::WriteGuard<'_>) -> Option<MergeJob<'g>> {
        let mini = self.mini_page(page)?;
        mini.node()
            .iter()
            .any(|r| r.record_type().is_dirty())
            .then(|| MergeJob::new(mini))
    }

    /// Merges, in one batch, the dirty mini-pages of the pages `locked` (write-locked,
    /// each checked to have one): their headers, and what `merge_batch` answered.
    pub(super) fn merge_locked(
        &self,
        locked: &[mapping::WriteGuard<'_>],
    ) -> (Vec<MiniHeader>, Vec<Result<bool, Op>>) {
        let jobs: Vec<MergeJob<'_>> = locked
            .iter()
            .map(|page| {
                self.dirty_mini(page)
                    .expect("checked by the caller, under the lock")
            })
            .collect();
        let merged = self.merge_batch(&jobs);
        (jobs.iter().map(|j| j.header).collect(), merged)
    }

    /// After flush merged a mini-page's dirty records: if the leaf split, the mini-page
    /// is dropped (its records may belong to other pages now); otherwise its records
    /// become clean copies. The caller holds the page's write lock.
    pub(super) fn after_flush_merge(
        &self,
        page: &mut mapping::WriteGuard<'_>,
        header: MiniHeader,
        split: bool,
    ) {
        let mut mini = self
            .mini_page_mut(page)
            .expect("a merged page keeps its mini-page");
        if split {
            let block = mini.block();
            page.set_location(Location::Leaf(header.leaf.0));
            self.retire(block);
        } else {
            mark_clean(&mut mini.node_mut());
            page.clear_dirty();
        }
    }

    /// Merges one page's dirty records into its leaf page for flush, waiting for its
    /// lock and retrying while a split cannot lock its inner nodes.
    pub(super) fn flush_page(&self, pid: PageId) -> Result<()> {
        loop {
            let mut page = self.mapping.write(pid);
            let Some(job) = self.dirty_mini(&page) else {
                return Ok(());
            };
            let header = job.header;
            match self.merge(pid, header, Some(job.mini.node()), None, false) {
                Ok(merged) => {
                    self.after_flush_merge(&mut page, header, merged.split());
                    return Ok(());
                }
                Err(Op::Restart | Op::WouldBlock) => {
                    drop(page);
                    crate::sync::thread::yield_now();
                }
                Err(Op::Fail(e)) => return Err(e),
            }
        }
    }
}
