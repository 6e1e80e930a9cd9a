//! Merges: a mini-page's dirty records written into its leaf page (Bf-Tree §4.3), one
//! page at a time (`merge`, `merge_full`) or batched across many pages with each step's
//! IO in one call (`merge_batch`). A merge that overflows redistributes into a
//! neighbour or splits.
//!
//! Uses: `plan`, `split`, `redistribute`, `mirror`, `leaf_io`, `mini`, `leaf`, `node`,
//! `mapping`, `stats`.

use crate::error::{Error, Result};
use crate::pool::Block;
use crate::storage::{Page, PageNo};

use super::leaf::{self, MiniHeader, RecordList};
use super::leaf_io::leaf_used_bytes;
use super::mapping::{self, Location, PageId};
use super::mini::{clean_after_merge, mini_ref, node_bytes_mut};
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

/// A mini-page whose dirty records go to its leaf page in a batched merge; the caller
/// holds its page's write lock.
pub(super) struct MergeJob {
    pub(super) block: Block,
    pub(super) header: MiniHeader,
}

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
    pub(super) fn merge(
        &self,
        pid: PageId,
        header: MiniHeader,
        mini: Option<NodeRef<'_>>,
        extra: Option<(&[u8], &[u8], RecordType)>,
        keep_open: bool,
    ) -> Result<Merged, Op> {
        let leaf = if header.mirror && mini.is_some() {
            None
        } else {
            let mut page = Page::boxed();
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
        page: &mapping::WriteGuard<'_>,
        block: Block,
        header: MiniHeader,
        key: &[u8],
        value: &[u8],
        record_type: RecordType,
    ) -> Result<(), Op> {
        if !record_type.is_dirty() {
            return Ok(());
        }
        // SAFETY: we hold the page's write lock.
        let mini = unsafe { mini_ref(&block) };
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
            if rebuilt.upsert(key, value, RecordType::Cache).is_err() {
                // The mirror cannot hold the leaf's records any more: drop it.
                page.set_location(Location::Leaf(header.leaf.0));
                self.retire(block);
                return Ok(());
            }
        } else if mirror && let Ok(i) = rebuilt.as_ref().search(key) {
            rebuilt.remove(i);
        }
        // SAFETY: we hold the page's write lock; `mini` is no longer used.
        unsafe { node_bytes_mut(&block) }.copy_from_slice(&scratch);
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
    /// store's error), so the dirty records stay in memory.
    pub(super) fn merge_batch(&self, jobs: &[MergeJob]) -> Vec<Result<bool, Op>> {
        let nos: Vec<PageNo> = jobs
            .iter()
            .filter(|j| !j.header.mirror)
            .map(|j| j.header.leaf)
            .collect();
        let mut pages: Vec<Box<Page>> = nos.iter().map(|_| Page::boxed()).collect();
        if !nos.is_empty() && self.read_leaves(&nos, &mut pages).is_err() {
            return jobs
                .iter()
                .map(|j| {
                    // SAFETY: the caller holds the job's page write lock.
                    let mini = unsafe { mini_ref(&j.block) };
                    self.merge(j.header.pid, j.header, Some(mini), None, false)
                        .map(|m| m.split())
                })
                .collect();
        }
        let mut pages = pages.into_iter();
        let mut results: Vec<Result<bool, Op>> = Vec::with_capacity(jobs.len());
        // Pages to rewrite in place (merged pages, and the left pages of splits).
        let mut writes: Vec<(usize, Box<Page>)> = Vec::with_capacity(jobs.len());
        let mut splits: Vec<(usize, PlannedSplit)> = Vec::new();
        // Overflowing pages with a neighbour locked to take records instead of a split.
        let mut pending: Vec<(usize, Neighbour<'_>, RecordList, Vec<leaf::LeafChunk>)> = Vec::new();
        let split = |i: usize,
                     records: RecordList,
                     chunks: Vec<leaf::LeafChunk>,
                     splits: &mut Vec<(usize, PlannedSplit)>|
         -> Result<bool, Op> {
            splits.push((i, self.plan_split(jobs[i].header.pid, records, chunks)?));
            Ok(true)
        };
        for (i, job) in jobs.iter().enumerate() {
            // SAFETY: the caller holds the job's page write lock.
            let mini = unsafe { mini_ref(&job.block) };
            let leaf = (!job.header.mirror).then(|| pages.next().expect("one page per job"));
            bump(&self.counters.merges);
            results.push(match self.plan_merge(job.header, Some(mini), None, leaf) {
                Ok(MergePlan::Write(new)) => {
                    writes.push((i, new));
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
                    None => split(i, records, chunks, &mut splits),
                },
                Err(e) => Err(e),
            });
        }
        // The neighbours' leaf pages in one batched read; a redistribution that does not
        // work out splits after all.
        let mut redistributions: Vec<(usize, Redistribution<'_>)> = Vec::new();
        if !pending.is_empty() {
            let nos: Vec<PageNo> = pending
                .iter()
                .filter(|(_, n, _, _)| !n.header.mirror)
                .map(|(_, n, _, _)| n.header.leaf)
                .collect();
            let mut leaves: Vec<Box<Page>> = nos.iter().map(|_| Page::boxed()).collect();
            let read = nos.is_empty() || self.read_leaves(&nos, &mut leaves).is_ok();
            let mut leaves = leaves.into_iter();
            for (i, neighbour, records, chunks) in pending {
                let leaf = (!neighbour.header.mirror).then(|| leaves.next().expect("one each"));
                let pid = jobs[i].header.pid;
                let planned = read
                    .then(|| self.plan_redistribution(pid, neighbour, leaf, &records, &chunks))
                    .flatten();
                match planned {
                    Some(r) => redistributions.push((i, r)),
                    None => results[i] = split(i, records, chunks, &mut splits),
                }
            }
        }
        // The splits' steps (1) and the neighbours' new pages with one `write_pages`;
        // then the splits' steps (2) and (3) and the redistributions' parents one by one;
        // the left pages of splits and the giving pages of redistributions join the
        // in-place writes, step (4).
        if !splits.is_empty() || !redistributions.is_empty() {
            for (_, r) in &redistributions {
                self.note_leaf_write(r.neighbour.page.id());
            }
            let mut reqs: Vec<(PageNo, &mut Page)> = splits
                .iter_mut()
                .flat_map(|(_, s)| s.right_writes())
                .chain(redistributions.iter_mut().map(|(_, r)| {
                    let no = r.neighbour.header.leaf;
                    (no, r.receiving())
                }))
                .collect();
            let written = self.write_leaves(&mut reqs);
            drop(reqs);
            if let Err(e) = written {
                for (_, split) in &splits {
                    self.abandon_split(split);
                }
                let failed = splits.iter().map(|&(i, _)| i);
                let failed = failed.chain(redistributions.iter().map(|(i, _)| *i));
                fail_all(e, failed, &mut results);
                splits.clear();
                redistributions.clear();
            }
        }
        for (i, split) in splits {
            match self.link_split(&split, None) {
                Ok(_) => writes.push((i, split.left_page())),
                Err(e) => results[i] = Err(e),
            }
        }
        // Neighbours written back as they were, their locks held until then.
        let mut restores: Vec<(mapping::WriteGuard<'_>, PageNo, Box<Page>)> = Vec::new();
        for (i, mut r) in redistributions {
            self.mapping
                .set_fill_hint(r.neighbour.page.id(), leaf_used_bytes(r.receiving()));
            if self.link_redistribution(&r) {
                writes.push((i, r.into_giving()));
            } else {
                results[i] = Err(Op::Restart);
                restores.push(r.into_restore());
            }
        }
        if writes.is_empty() && restores.is_empty() {
            return results;
        }
        for &(i, _) in &writes {
            self.note_leaf_write(jobs[i].header.pid);
        }
        for (page, _, _) in &restores {
            self.note_leaf_write(page.id());
        }
        let mut reqs: Vec<(PageNo, &mut Page)> = writes
            .iter_mut()
            .map(|(i, new)| (jobs[*i].header.leaf, &mut **new))
            .chain(restores.iter_mut().map(|(_, no, p)| (*no, &mut **p)))
            .collect();
        if let Err(e) = self.write_leaves(&mut reqs) {
            fail_all(e, writes.iter().map(|&(i, _)| i), &mut results);
            return results;
        }
        for (i, page) in &writes {
            self.mapping
                .set_fill_hint(jobs[*i].header.pid, leaf_used_bytes(page));
        }
        for (page, _, restored) in &restores {
            self.mapping
                .set_fill_hint(page.id(), leaf_used_bytes(restored));
        }
        results
    }
}
