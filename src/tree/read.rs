//! Point reads: a key is looked up in its page's mini-page first (which is
//! authoritative for what it holds), then in the leaf page; what a read finds on disk may
//! be cached in the pool (a record, or the whole page as a mirror) by the admission
//! rules. Also the batched `get_many`, which reads the leaf pages of many keys in one
//! batch without their page locks and validates each with its ticket.
//!
//! Uses: `write` (caching a record), `mirror`, `leaf_io`, `mini`, `descend`, `leaf`,
//! `node`, `mapping`, `stats`.

use crate::error::Result;
use crate::pool::Block;
use crate::storage::PageNo;

use super::leaf_io::LeafTicket;
use super::leaf_page::LeafPage;
use super::mapping::{self, Location, MappingTable, PageId};
use super::mini::PageLock;
use super::mirror::MirrorRefused;
use super::node::{NodeRef, RecordType};
use super::stats::bump;
use super::{Core, Op};

/// What the leaf level found for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// The key's record, from the mini-page or the leaf page; its value is in `out`.
    Value,
    /// The key's record, whose value is kept out of line: `out` holds its reference.
    External,
    /// The key is absent (tombstone, phantom, mirror miss or leaf miss).
    Absent,
}

impl Found {
    /// What record type `t` says about its key.
    pub(super) fn of(t: RecordType) -> Found {
        match t {
            t if t.is_external() => Found::External,
            t if t.exists() => Found::Value,
            _ => Found::Absent,
        }
    }

    /// Whether the key exists.
    pub(crate) fn exists(self) -> bool {
        self != Found::Absent
    }
}

/// What a probe of the mini-pages found.
pub(crate) enum Probe {
    /// Answered without the leaf page.
    Done(Found),
    /// The leaf page must be read.
    Leaf(LeafTicket),
}

/// Looks `key` up in a leaf node, appending its value to `out` if present.
pub(super) fn search_leaf(leaf: &NodeRef<'_>, key: &[u8], out: &mut Vec<u8>) -> Found {
    match leaf.search(key) {
        Ok(i) => {
            out.extend_from_slice(leaf.value(i));
            Found::of(leaf.record_type(i))
        }
        Err(_) => Found::Absent,
    }
}

/// A cheap per-thread coin with `percent` chance of heads (xorshift64*). Under shuttle
/// the coin is shuttle's, so a failing schedule's seed replays the same tosses.
pub(super) fn chance(percent: u8) -> bool {
    if percent == 0 {
        return false;
    }
    #[cfg(feature = "shuttle")]
    {
        use shuttle::rand::RngCore;
        shuttle::rand::thread_rng().next_u64() % 100 < u64::from(percent)
    }
    #[cfg(not(feature = "shuttle"))]
    RNG.with(|r| {
        let mut x = r.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        r.set(x);
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) % 100 < u64::from(percent)
    })
}

#[cfg(not(feature = "shuttle"))]
thread_local! {
    pub(super) static RNG: std::cell::Cell<u64> = std::cell::Cell::new({
        let addr = &0u8 as *const u8 as u64;
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        (addr ^ time.rotate_left(17)) | 1
    });
}

/// Distinct leaf pages `get_many` reads in one batch (bounds its buffers to 512 KiB).
pub(super) const GET_MANY_BATCH_PAGES: usize = 128;

impl Core {
    pub(super) fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Result<Found> {
        // No lock is held across the leaf page's IO: the mini-page is probed under the
        // page's read lock, the leaf page read without it, and the answer (and the
        // record cached from it) validated by the page's leaf-write counter under the
        // lock again. Other reads and writes of a hot page go on during the IO.
        let ticket = match self.probe(key, out)? {
            Probe::Done(found) => return Ok(found),
            Probe::Leaf(ticket) => ticket,
        };
        let promote = self.promote_point_read(key);
        let mut page = self.new_leaf_page();
        // A failed read may have met a page being rewritten (a torn page fails its
        // checksum): the locked read below reports real errors.
        if self.read_leaf_bytes(ticket.leaf, &mut page).is_ok() {
            bump(&self.counters.leaf_reads);
            if let Some(found) = self.finish_read(key, &ticket, &page, out, promote)? {
                return Ok(found);
            }
            bump(&self.counters.stale_leaf_reads);
        }
        out.clear();
        self.get_under_lock(key, out, promote)
    }

    /// Reads `key` holding its page's lock across the leaf page's IO: the fallback when
    /// a read without the lock went stale. A read that caches what the leaf page says
    /// takes the page's write lock *before* reading the leaf page, so the leaf cannot
    /// change between the read and the insertion of the cached record.
    pub(super) fn get_under_lock(
        &self,
        key: &[u8],
        out: &mut Vec<u8>,
        promote: bool,
    ) -> Result<Found> {
        loop {
            // The read lock is released before the write lock is taken.
            let (path, shared) = {
                let (path, page) = self.lock_leaf_of(key, MappingTable::read);
                let shared = self.get_locked(&page, key, out, !promote)?;
                (path, shared)
            };
            let (found, touched) = match shared {
                Some(result) => result,
                None => {
                    let mut page = self.mapping.write(path.pid);
                    if path.validate().is_err() {
                        bump(&self.counters.restarts);
                        continue;
                    }
                    self.get_promoting(&mut page, path.prefix_len, key, out)?
                }
            };
            if let Some(block) = touched {
                self.touch(path.pid, block, key);
            }
            return Ok(found);
        }
    }

    /// Reads `key` under a page lock. Also returns the mini-page block when the hit
    /// there needs maintenance (reference bit, copy-on-access) after unlocking.
    /// `Ok(None)`: the mini-page does not know the key and `read_leaf` is false.
    pub(super) fn get_locked(
        &self,
        page: &impl PageLock,
        key: &[u8],
        out: &mut Vec<u8>,
        read_leaf: bool,
    ) -> Result<Option<(Found, Option<Block>)>> {
        let leaf_no = match page.location() {
            Location::Mini(_) => {
                let mini_page = self.mini_page(page).expect("the page maps a mini-page");
                let (block, header) = (mini_page.block(), mini_page.header());
                let mini = mini_page.node();
                match mini.search(key) {
                    Ok(i) => {
                        let r = mini.record(i);
                        let found = Found::of(r.record_type());
                        if found.exists() {
                            out.extend_from_slice(r.value());
                        }
                        let maintain = !r.ref_bit() || self.pool.in_copy_on_access_region(&block);
                        return Ok(Some((found, maintain.then_some(block))));
                    }
                    Err(_) if header.mirror => return Ok(Some((Found::Absent, None))),
                    Err(_) => header.leaf,
                }
            }
            Location::Leaf(no) => PageNo(no),
            Location::Empty => unreachable!("a routed page id is in use"),
        };
        if !read_leaf {
            return Ok(None);
        }
        let mut leaf_page = self.new_leaf_page();
        let leaf = self.read_leaf(leaf_no, &mut leaf_page)?;
        self.check_route(page.id(), leaf_no, &leaf)?;
        Ok(Some((search_leaf(&leaf, key, out), None)))
    }

    /// Reads `key` under the page's write lock and caches what the leaf page said (the
    /// record, or a phantom for a miss) in the mini-page.
    pub(super) fn get_promoting(
        &self,
        page: &mut mapping::WriteGuard<'_>,
        prefix_len: usize,
        key: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(Found, Option<Block>)> {
        if let Some(hit) = self.get_locked(page, key, out, false)? {
            return Ok(hit);
        }
        let mut leaf_page = self.new_leaf_page();
        let leaf_no = self.leaf_of(&*page);
        let leaf = self.read_leaf(leaf_no, &mut leaf_page)?;
        self.check_route(page.id(), leaf_no, &leaf)?;
        let found = search_leaf(&leaf, key, out);
        if !self.mirror_read(page, leaf_no, &leaf) {
            self.cache_read(page, prefix_len, key, found, out)?;
        }
        Ok((found, None))
    }

    /// Whether a scan that reaches a leaf page should cache it: always while the pool
    /// has mirror room, else by the scan promotion chance.
    pub(super) fn promote_scan(&self) -> bool {
        self.config.scan_promotion_rate_percent > 0
            && (self.mirror_room() || chance(self.config.scan_promotion_rate_percent))
    }

    /// Whether a point read of `key` that reaches its leaf page should cache what it
    /// reads: always while the pool has mirror room or room for records; else when the
    /// key's leaf-page read is the second in the doorkeeper's window (`admission`), or by
    /// the promotion chance. Call it once per leaf-page read: it records the read (unless
    /// the pool's room already decided).
    pub(crate) fn promote_point_read(&self, key: &[u8]) -> bool {
        if self.config.promotion_rate_percent == 0 {
            return false;
        }
        self.mirror_room()
            || self.record_room()
            || self.pool.doorkeeper.seen_again(self.owner, key)
            || chance(self.config.promotion_rate_percent)
    }

    /// Replaces the page's mini-page (if any) by a mirror of `leaf`, the leaf page just
    /// read under the page's write lock, when the pool has mirror room; best effort,
    /// never evicts. Returns true when the read must cache nothing more: the page is a
    /// mirror now, or its mini-page was merged to make room for one.
    pub(super) fn mirror_read(
        &self,
        page: &mapping::WriteGuard<'_>,
        leaf_no: PageNo,
        leaf: &NodeRef<'_>,
    ) -> bool {
        if !self.mirror_room() || self.check_writable().is_err() {
            return false;
        }
        if page.location() == Location::Empty {
            return false;
        }
        let old_mini = self.mini_page(page);
        let old = old_mini.map(|m| m.block());
        let mini = old_mini.map(|m| m.node());
        let block = match self.build_mirror(
            page,
            leaf_no,
            leaf,
            mini.as_ref(),
            self.leaf.max_mini_block_bytes(),
        ) {
            Ok(block) => block,
            Err(MirrorRefused::NoRoom) => return false,
            // The dirty records do not fit next to the leaf's. Merge them into the leaf
            // page now, as eviction would (splitting it if needed), so that the next
            // read of the page finds no dirty records and mirrors it. A failed merge
            // leaves the page as it was; eviction retries it later.
            // A split may have moved the key to another page: caching it here could put
            // it in the wrong one, so after a merge the read caches nothing.
            Err(MirrorRefused::TooFull) => {
                return old.is_some() && self.merge_for_mirror(page, leaf_no);
            }
        };
        self.publish(page, block);
        if let Some(old) = old {
            self.retire(old);
        }
        bump(&self.counters.mirrors_created);
        true
    }

    /// Caches what the leaf page said about `key` (the record in `out`, or a phantom for
    /// a miss) in the mini-page. The caller holds the page's write lock and read the leaf
    /// page under it, or validated a read made without it. Best effort: if the pool
    /// cannot make room without blocking, nothing is cached.
    pub(super) fn cache_read(
        &self,
        page: &mut mapping::WriteGuard<'_>,
        prefix_len: usize,
        key: &[u8],
        found: Found,
        out: &[u8],
    ) -> Result<()> {
        if self.check_writable().is_err() {
            return Ok(());
        }
        let (value, record_type) = match found {
            Found::Value => (out, RecordType::Cache),
            Found::External => (out, RecordType::CacheExternal),
            Found::Absent => (&[][..], RecordType::Phantom),
        };
        match self.put_in_mini(page, prefix_len, key, value, record_type) {
            Ok(()) => bump(if found.exists() {
                &self.counters.records_promoted
            } else {
                &self.counters.phantoms_promoted
            }),
            Err(Op::Fail(e)) => return Err(e),
            Err(Op::Restart | Op::WouldBlock) => {}
        }
        Ok(())
    }

    /// Answers `key` from its mini-page if it can, under the page's read lock; otherwise
    /// returns a ticket for reading the leaf page later without the lock.
    pub(crate) fn probe(&self, key: &[u8], out: &mut Vec<u8>) -> Result<Probe> {
        let (path, page) = self.lock_leaf_of(key, MappingTable::read);
        Ok(match self.get_locked(&page, key, out, false)? {
            Some(hit) => Probe::Done(self.answer_hit(path.pid, page, hit, key)),
            None => Probe::Leaf(self.ticket(path.pid, &page, path.prefix_len)),
        })
    }

    /// Finishes a read of `key` that `probe` sent to the leaf page, with `leaf_page` as
    /// read (without the lock) after the ticket was taken. `Ok(None)`: the read is stale,
    /// do it again under the lock. With `promote`, caches what the leaf said under the
    /// write lock, as [`Core::get`] does.
    pub(crate) fn finish_read(
        &self,
        key: &[u8],
        ticket: &LeafTicket,
        leaf_page: &LeafPage,
        out: &mut Vec<u8>,
        promote: bool,
    ) -> Result<Option<Found>> {
        out.clear();
        if promote && self.check_writable().is_ok() {
            let mut page = self.mapping.write(ticket.pid);
            if !self.ticket_valid(ticket, &page) {
                return Ok(None);
            }
            // The mini-page may have learnt the key since the probe: it is newer.
            if let Some(hit) = self.get_locked(&page, key, out, false)? {
                return Ok(Some(self.answer_hit(ticket.pid, page, hit, key)));
            }
            let leaf = self.parse_leaf(ticket.leaf, leaf_page)?;
            self.check_route(ticket.pid, ticket.leaf, &leaf)?;
            let found = search_leaf(&leaf, key, out);
            if !self.mirror_read(&page, ticket.leaf, &leaf) {
                self.cache_read(&mut page, ticket.prefix_len, key, found, out)?;
            }
            return Ok(Some(found));
        }
        let page = self.mapping.read(ticket.pid);
        if !self.ticket_valid(ticket, &page) {
            return Ok(None);
        }
        if let Some(hit) = self.get_locked(&page, key, out, false)? {
            return Ok(Some(self.answer_hit(ticket.pid, page, hit, key)));
        }
        let leaf = self.parse_leaf(ticket.leaf, leaf_page)?;
        self.check_route(ticket.pid, ticket.leaf, &leaf)?;
        Ok(Some(search_leaf(&leaf, key, out)))
    }

    /// Point reads of many keys: mini-pages first, then every leaf page still needed in
    /// one batched read per `GET_MANY_BATCH_PAGES` distinct pages.
    pub(super) fn get_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        let _guard = self.value_guard();
        let mut results: Vec<Option<Vec<u8>>> = Vec::with_capacity(keys.len());
        // Keys waiting for a leaf page: index, ticket, promotion coin.
        let mut pending: Vec<(usize, LeafTicket, bool)> = Vec::new();
        let mut leaves: Vec<PageNo> = Vec::new();
        // Values out of line, read together at the end: index and reference.
        let mut externals = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let mut out = Vec::new();
            match self.probe(key.as_ref(), &mut out)? {
                Probe::Done(Found::External) => {
                    externals.push((i, out));
                    results.push(None);
                }
                Probe::Done(found) => {
                    let exists = self.resolve(found, &mut out)?;
                    results.push(exists.then_some(out));
                }
                Probe::Leaf(ticket) => {
                    let promote = self.promote_point_read(key.as_ref());
                    results.push(None);
                    if !leaves.contains(&ticket.leaf) {
                        leaves.push(ticket.leaf);
                    }
                    pending.push((i, ticket, promote));
                }
            }
            if leaves.len() == GET_MANY_BATCH_PAGES {
                self.finish_many(
                    keys,
                    (&mut pending, &mut leaves),
                    &mut results,
                    &mut externals,
                )?;
            }
        }
        self.finish_many(
            keys,
            (&mut pending, &mut leaves),
            &mut results,
            &mut externals,
        )?;
        self.resolve_many(externals, &mut results)?;
        Ok(results)
    }

    /// Reads the leaf pages `leaves` in one batch and answers the `pending` keys from
    /// them; a key whose page changed meanwhile is read again under its lock.
    /// The values it finds out of line go to `externals` (index and reference).
    pub(super) fn finish_many<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        (pending, leaves): (&mut Vec<(usize, LeafTicket, bool)>, &mut Vec<PageNo>),
        results: &mut [Option<Vec<u8>>],
        externals: &mut Vec<(usize, Vec<u8>)>,
    ) -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        leaves.sort_unstable();
        let mut pages: Vec<LeafPage> = leaves.iter().map(|_| self.new_leaf_page()).collect();
        // A failed batch may have failed on a page read while a writer rewrote it (a
        // torn page fails its checksum): every key then goes the locked way, which
        // reports a real error.
        let read_ok = self.read_leaves(leaves, &mut pages).is_ok();
        for (i, ticket, promote) in pending.drain(..) {
            let key = keys[i].as_ref();
            let mut out = Vec::new();
            let mut found = None;
            if read_ok {
                let slot = leaves
                    .binary_search(&ticket.leaf)
                    .expect("every pending leaf was read");
                found = self.finish_read(key, &ticket, &pages[slot], &mut out, promote)?;
                if found.is_none() {
                    bump(&self.counters.stale_leaf_reads);
                }
            }
            let found = match found {
                Some(found) => found,
                None => {
                    out.clear();
                    self.get_under_lock(key, &mut out, promote)?
                }
            };
            match found {
                Found::External => externals.push((i, out)),
                found => results[i] = self.resolve(found, &mut out)?.then_some(out),
            }
        }
        leaves.clear();
        Ok(())
    }

    /// Answers a read of `key` that page `pid`'s mini-page settled (`hit`, from
    /// `get_locked`): releases the page's lock `page`, then maintains the block if the
    /// hit asked for it (`touch`, which takes the write lock). Whether the key exists.
    fn answer_hit<G>(
        &self,
        pid: PageId,
        page: G,
        (found, touched): (Found, Option<Block>),
        key: &[u8],
    ) -> Found {
        drop(page);
        if let Some(block) = touched {
            self.touch(pid, block, key);
        }
        found
    }

    /// After a mini-page hit: set the record's reference bit, and copy the mini-page to
    /// the tail if it sits in the copy-on-access region. Best effort, never waits.
    pub(super) fn touch(&self, pid: PageId, block: Block, key: &[u8]) {
        let Some(mut page) = self.mapping.try_write(pid) else {
            return;
        };
        // The same offset is not enough: after the pool wraps a lap, another block (of
        // another size) may sit there. The block at the offset must be this one.
        if page.location() != Location::Mini(block.offset()) || self.block(block.offset()) != block
        {
            return;
        }
        let mut mini_page = self.mini_page_mut(&mut page).expect("checked above");
        let mut mini = mini_page.node_mut();
        if let Ok(i) = mini.as_ref().search(key) {
            mini.set_ref_bit(i, true);
        }
        if self.pool.in_copy_on_access_region(&block) {
            let _ = self.copy_to_tail(&page);
        }
    }
}
