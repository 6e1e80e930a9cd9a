//! Merges: a mini-page's dirty records written into its leaf page (Bf-Tree §4.3), one
//! page at a time (`merge`, `merge_full`) or batched across many pages with each step's
//! IO in one call (`merge_batch`). A merge that overflows redistributes into a
//! neighbour or splits.
//!
//! Uses: `plan`, `split`, `redistribute`, `mirror`, `leaf_io`, `mini`, `leaf`, `node`,
//! `mapping`, `stats`.

use crate::error::{Error, Result};
use crate::storage::PageNo;
use crate::sync::atomic::Ordering;

use super::leaf::{self, MiniHeader, RecordList};
use super::leaf_page::LeafPage;
use super::mapping::{self, Location, PageId};
use super::mini::MiniPage;
use super::mini::clean_after_merge;
use super::mirror::OpenEnd;
use super::node::{NodeMut, NodeRef, RecordType};
use super::plan::MergePlan;
use super::redistribute::{Neighbour, Redistribution};
use super::split::PlannedSplit;
use super::stats::bump;
use super::{Core, Op};

/// What `merge` did to the leaf page.
pub(super) enum Merged {
    /// Rewrote it in place.
    InPlace,
    /// Split it; for a sorted-order split, with the page the next records land in.
    Split(Option<OpenEnd>),
}

impl Merged {
    pub(super) fn split(&self) -> bool {
        matches!(self, Merged::Split(_))
    }
}

/// A mini-page whose dirty records go to its leaf page in a batched merge, seen under
/// its page's write lock (which the job borrows).
pub(super) struct MergeJob<'g> {
    pub(super) mini: MiniPage<'g>,
    pub(super) header: MiniHeader,
}

impl<'g> MergeJob<'g> {
    /// The job of merging `mini`.
    pub(super) fn new(mini: MiniPage<'g>) -> MergeJob<'g> {
        MergeJob {
            header: mini.header(),
            mini,
        }
    }
}

/// A batched merge between its phases (`Core::merge_batch`): each job's answer so far,
/// the pages to rewrite in place (merged pages, and the left pages of splits), and the
/// planned splits and redistributions (their neighbours still locked).
struct Batch<'t> {
    results: Vec<Result<bool, Op>>,
    writes: Vec<(usize, LeafPage)>,
    splits: Vec<(usize, PlannedSplit)>,
    redistributions: Vec<(usize, Redistribution<'t>)>,
}

impl Batch<'_> {
    /// Plans job `i`'s split of page `pid`; its answer.
    fn split(
        &mut self,
        core: &Core,
        i: usize,
        pid: PageId,
        records: RecordList,
        chunks: Vec<leaf::LeafChunk>,
    ) -> Result<bool, Op> {
        self.splits
            .push((i, core.plan_split(pid, records, chunks)?));
        Ok(true)
    }
}

/// A neighbour to write back as it was, with its lock, leaf page and old page.
type Restore<'t> = (mapping::WriteGuard<'t>, PageNo, LeafPage);

/// Answers a failed batched write for every job in `jobs`: the first gets the store's
/// error, the rest the poisoning it caused (the write poisoned the tree).
pub(super) fn fail_all(
    e: Error,
    jobs: impl Iterator<Item = usize>,
    results: &mut [Result<bool, Op>],
) {
    let cause = e.to_string();
    let mut first = Some(e);
    for i in jobs {
        let e = first.take().unwrap_or_else(|| Error::Poisoned {
            cause: cause.clone(),
        });
        results[i] = Err(Op::Fail(e));
    }
}

impl Core {
    /// Merges the dirty records of `mini` (and `extra`, a record not yet placed anywhere)
    /// into the page's leaf page, splitting it when they do not fit. Returns whether the
    /// leaf split (the caller must then drop the mini-page: its records may now belong to
    /// other pages). The caller holds the page's write lock.
    ///
    /// A mirror's live records *are* the leaf's, so it is written without reading the leaf.
    ///
    /// Refuses (`Poisoned`) once the tree is poisoned: a failed write may have left the
    /// page's leaf page narrower than its mini-page's records or wider than its range,
    /// which no plan can be made over (docs/design.md, "Failure"). The failing operation
    /// recorded the failure before it released the page's lock, which the caller holds.
    pub(super) fn merge(
        &self,
        pid: PageId,
        header: MiniHeader,
        mini: Option<NodeRef<'_>>,
        extra: Option<(&[u8], &[u8], RecordType)>,
        keep_open: bool,
    ) -> Result<Merged, Op> {
        self.check_writable()?;
        let leaf = if header.mirror && mini.is_some() {
            None
        } else {
            let mut page = self.new_leaf_page();
            self.read_leaf(header.leaf, &mut page)?;
            Some(page)
        };
        bump(&self.counters.merges);
        match self.plan_merge(header, mini, extra, leaf)? {
            MergePlan::Write(mut page) => {
                self.write_leaf(pid, header.leaf, &mut page)?;
                Ok(Merged::InPlace)
            }
            MergePlan::Split {
                records,
                chunks,
                open,
            } => {
                if open.is_none() && self.redistribute(pid, header.leaf, &records, &chunks)? {
                    return Ok(Merged::Split(None));
                }
                let open = keep_open.then_some(open).flatten();
                let open = self.split_leaf(pid, header.leaf, records, chunks, open)?;
                Ok(Merged::Split(open))
            }
        }
    }

    /// The mini-page is full at the merge threshold (or is a full mirror, or cannot grow
    /// for want of pool room): merge its dirty records and the new record into the leaf
    /// page, then keep only its hot clean records (§5.5). A clean new record (a read being cached) is dropped instead: not
    /// worth a merge.
    pub(super) fn merge_full(
        &self,
        page: &mut mapping::WriteGuard<'_>,
        header: MiniHeader,
        key: &[u8],
        value: &[u8],
        record_type: RecordType,
    ) -> Result<(), Op> {
        if !record_type.is_dirty() {
            return Ok(());
        }
        let mini_page = self.mini_page(page).expect("the page maps a mini-page");
        let (block, mini) = (mini_page.block(), mini_page.node());
        let merged = self.merge(
            page.id(),
            header,
            Some(mini),
            Some((key, value, record_type)),
            true,
        )?;
        if let Merged::Split(open) = merged {
            page.set_location(Location::Leaf(header.leaf.0));
            self.retire(block);
            if let Some(open) = open {
                self.mirror_open_end(page, open.leaf, &open.page);
            }
            return Ok(());
        }
        let mirror = header.mirror;
        let mut scratch = clean_after_merge(&mini, mirror, Some(key));
        let mut rebuilt = NodeMut::trusted(&mut scratch);
        if mirror && record_type.exists() {
            // The new record is in the leaf page; the mirror must hold it too.
            if rebuilt.upsert(key, value, record_type.clean()).is_err() {
                // The mirror cannot hold the leaf's records any more: drop it.
                page.set_location(Location::Leaf(header.leaf.0));
                self.retire(block);
                return Ok(());
            }
        } else if mirror && let Ok(i) = rebuilt.as_ref().search(key) {
            rebuilt.remove(i);
        }
        self.mini_page_mut(page)
            .expect("the page maps a mini-page")
            .overwrite(&scratch);
        Ok(())
    }

    /// Merges the dirty records of several mini-pages into their leaf pages with batched
    /// IO: the leaf pages are read with one `read_pages` call; the new right-hand pages
    /// of every split with one `write_pages` call; then each split links its pages into
    /// the inner nodes; and finally the merged pages and the splits' left pages are
    /// written with one `write_pages` call. So a batch waits for at most three IO round
    /// trips however many of its pages split (`split_leaf` alone takes three per split,
    /// after the read). Answers, per job in order, what `merge` would: whether the leaf
    /// split, or why the merge failed. The caller
    /// holds every job's page write lock, and took the locks after the first with
    /// try-locks only (or holds just one), so no thread waits for it while it waits.
    ///
    /// If the batch read fails, the pages are merged one by one, which finds and records
    /// the page that fails. If the batch write fails, the tree is poisoned as for a
    /// single failed write and every written job answers the failure (the first with the
    /// store's error), so the dirty records stay in memory. The store may have written
    /// any part of the batch: a page rewritten before the failing write keeps its whole
    /// mini-page, and one after it keeps its old leaf page (docs/design.md, "Failure").
    /// So a poisoned tree merges nothing: every job answers `Poisoned`, as in `merge`.
    pub(super) fn merge_batch(&self, jobs: &[MergeJob<'_>]) -> Vec<Result<bool, Op>> {
        if self.failed.load(Ordering::Acquire) {
            return jobs
                .iter()
                .map(|_| Err(Op::Fail(self.poisoned())))
                .collect();
        }
        let nos: Vec<PageNo> = jobs
            .iter()
            .filter(|j| !j.header.mirror)
            .map(|j| j.header.leaf)
            .collect();
        let mut pages: Vec<LeafPage> = nos.iter().map(|_| self.new_leaf_page()).collect();
        if !nos.is_empty() && self.read_leaves(&nos, &mut pages).is_err() {
            return jobs
                .iter()
                .map(|j| {
                    let mini = j.mini.node();
                    self.merge(j.header.pid, j.header, Some(mini), None, false)
                        .map(|m| m.split())
                })
                .collect();
        }
        let mut batch = self.plan_batch(jobs, pages);
        self.write_batch_new_pages(&mut batch);
        let restores = self.link_batch(&mut batch);
        self.write_batch_in_place(jobs, batch, restores)
    }

    /// A batched merge's plans, from the jobs' leaf pages as read (one per job that is
    /// not a mirror, in order): each job rewrites its page in place, splits, or gives
    /// records to a neighbour. The neighbours' leaf pages are read in one batch; a
    /// redistribution that does not work out splits after all.
    fn plan_batch<'t>(&'t self, jobs: &[MergeJob<'_>], pages: Vec<LeafPage>) -> Batch<'t> {
        let mut pages = pages.into_iter();
        let mut batch = Batch {
            results: Vec::with_capacity(jobs.len()),
            writes: Vec::with_capacity(jobs.len()),
            splits: Vec::new(),
            redistributions: Vec::new(),
        };
        // Overflowing pages with a neighbour locked to take records instead of a split.
        let mut pending: Vec<(usize, Neighbour<'_>, RecordList, Vec<leaf::LeafChunk>)> = Vec::new();
        for (i, job) in jobs.iter().enumerate() {
            let mini = job.mini.node();
            let leaf = (!job.header.mirror).then(|| pages.next().expect("one page per job"));
            bump(&self.counters.merges);
            let result = match self.plan_merge(job.header, Some(mini), None, leaf) {
                Ok(MergePlan::Write(new)) => {
                    batch.writes.push((i, new));
                    Ok(false)
                }
                Ok(MergePlan::Split {
                    records,
                    chunks,
                    open,
                }) => match open
                    .is_none()
                    .then(|| self.pick_neighbour(job.header.pid, &records, &chunks))
                    .flatten()
                {
                    Some(neighbour) => {
                        pending.push((i, neighbour, records, chunks));
                        Ok(true)
                    }
                    None => batch.split(self, i, job.header.pid, records, chunks),
                },
                Err(e) => Err(e),
            };
            batch.results.push(result);
        }
        if pending.is_empty() {
            return batch;
        }
        let nos: Vec<PageNo> = pending
            .iter()
            .filter(|(_, n, _, _)| !n.header.mirror)
            .map(|(_, n, _, _)| n.header.leaf)
            .collect();
        let mut leaves: Vec<LeafPage> = nos.iter().map(|_| self.new_leaf_page()).collect();
        let read = nos.is_empty() || self.read_leaves(&nos, &mut leaves).is_ok();
        let mut leaves = leaves.into_iter();
        for (i, neighbour, records, chunks) in pending {
            let leaf = (!neighbour.header.mirror).then(|| leaves.next().expect("one each"));
            let pid = jobs[i].header.pid;
            let planned = read
                .then(|| self.plan_redistribution(pid, neighbour, leaf, &records, &chunks))
                .flatten();
            match planned {
                Some(r) => batch.redistributions.push((i, r)),
                None => batch.results[i] = batch.split(self, i, pid, records, chunks),
            }
        }
        batch
    }

    /// The splits' step (1) and the neighbours' new pages, with one `write_pages`. On
    /// failure every split and redistribution of the batch answers it and is dropped.
    fn write_batch_new_pages(&self, batch: &mut Batch<'_>) {
        if batch.splits.is_empty() && batch.redistributions.is_empty() {
            return;
        }
        for (_, r) in &batch.redistributions {
            self.note_leaf_write(r.neighbour.page.id());
        }
        let mut reqs: Vec<(PageNo, &mut LeafPage)> = batch
            .splits
            .iter_mut()
            .flat_map(|(_, s)| s.right_writes())
            .chain(batch.redistributions.iter_mut().map(|(_, r)| {
                let no = r.neighbour.header.leaf;
                (no, r.receiving())
            }))
            .collect();
        let written = self.write_leaves(&mut reqs);
        drop(reqs);
        if let Err(e) = written {
            for (_, split) in &batch.splits {
                self.abandon_split(split);
            }
            let failed = batch.splits.iter().map(|&(i, _)| i);
            let failed = failed.chain(batch.redistributions.iter().map(|(i, _)| *i));
            let failed: Vec<usize> = failed.collect();
            fail_all(e, failed.into_iter(), &mut batch.results);
            batch.splits.clear();
            batch.redistributions.clear();
        }
    }

    /// The splits' steps (2) and (3) and the redistributions' parents, one by one. The
    /// left pages of splits and the giving pages of redistributions join the in-place
    /// writes, step (4); a redistribution whose parent changed writes its neighbour back
    /// as it was (the restores returned), its lock held until then.
    fn link_batch<'t>(&'t self, batch: &mut Batch<'t>) -> Vec<Restore<'t>> {
        for (i, split) in std::mem::take(&mut batch.splits) {
            match self.link_split(&split, None) {
                Ok(_) => batch.writes.push((i, split.left_page())),
                Err(e) => batch.results[i] = Err(e),
            }
        }
        let mut restores = Vec::new();
        for (i, mut r) in std::mem::take(&mut batch.redistributions) {
            self.note_fill(r.neighbour.page.id(), r.receiving());
            if self.link_redistribution(&r) {
                batch.writes.push((i, r.into_giving()));
            } else {
                batch.results[i] = Err(Op::Restart);
                restores.push(r.into_restore());
            }
        }
        restores
    }

    /// Step (4): the merged pages, the left pages of splits, the giving pages of
    /// redistributions and the restored neighbours, with one `write_pages`; returns
    /// every job's answer.
    fn write_batch_in_place(
        &self,
        jobs: &[MergeJob<'_>],
        mut batch: Batch<'_>,
        mut restores: Vec<Restore<'_>>,
    ) -> Vec<Result<bool, Op>> {
        let (writes, mut results) = (&mut batch.writes, batch.results);
        if writes.is_empty() && restores.is_empty() {
            return results;
        }
        for &(i, _) in writes.iter() {
            self.note_leaf_write(jobs[i].header.pid);
        }
        for (page, _, _) in &restores {
            self.note_leaf_write(page.id());
        }
        let mut reqs: Vec<(PageNo, &mut LeafPage)> = writes
            .iter_mut()
            .map(|(i, new)| (jobs[*i].header.leaf, new))
            .chain(restores.iter_mut().map(|(_, no, p)| (*no, p)))
            .collect();
        if let Err(e) = self.write_leaves(&mut reqs) {
            fail_all(e, writes.iter().map(|&(i, _)| i), &mut results);
            return results;
        }
        for (i, page) in writes.iter() {
            self.note_fill(jobs[*i].header.pid, page);
        }
        for (page, _, restored) in &restores {
            self.note_fill(page.id(), restored);
        }
        results
    }
}
