//! Writes: an insert, update or delete lands in the page's mini-page (created, grown or
//! merged as needed; Bf-Tree §4.2), never in the leaf page directly.
//!
//! Invariant: a writer holding a page lock never waits for another page lock; an
//! allocation that must evict does so only with try-locks, and one that cannot make room
//! drops every lock and restarts.
//!
//! Uses: `merge` (a full mini-page), `mini`, `descend`, `signal`, `leaf`, `node`,
//! `mapping`, `stats`.

use crate::error::{Error, Result};
use crate::storage::PageNo;

use super::leaf::{self, MINI_HEADER_BYTES, MiniHeader};
use super::mapping::{self, DirtyStamp, Location, MappingTable};
use super::mini::{drop_cold_clean, place};
use super::node::{self, RecordType};
use super::stats::bump;
use super::values::Replaced;
use super::{Core, Op};

/// A full mini-page grows to the size class holding this percentage of its size (one
/// class step, as the pool's classes are a quarter apart). Measured at 4M records and a
/// 16 MiB pool (Zipf 0.9, 2 threads, 20-s phases): growing by 125% read 1,476 leaf bytes
/// per get once warm and wrote 174 B per update, 150% 1,548 and 189, doubling 1,696 and
/// 222: the smaller the step, the less of each block is empty tail.
pub(super) const MINI_GROWTH_PERCENT: usize = 125;

impl Core {
    /// Upserts (`Some(value)`) or deletes (`None`) `key`.
    pub(super) fn write(&self, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        self.write_logging(key, value, &mut || Ok(None))
    }

    /// [`Core::write`], calling `log` each time the key's page has been locked for the
    /// write and before the record is placed: a logged write appends its log record
    /// there, so that two writes of one key reach the log in the order they reach the
    /// page (the journal's order rule; see `journal.rs`). An attempt that must restart
    /// drops the page lock and calls `log` again on the next; an error from `log`
    /// ends the write. `log` answers the checkpoint epoch its record was appended in,
    /// or `None` for a write no record covers (an unlogged write, a batch's write whose
    /// record is the batch's, recovery's replay), and the page's dirty stamp notes it
    /// (`mapping::DirtyStamp`): a checkpoint merges an unlogged write's page whatever
    /// its age.
    pub(super) fn write_logging(
        &self,
        key: &[u8],
        value: Option<&[u8]>,
        log: &mut dyn FnMut() -> Result<Option<u64>>,
    ) -> Result<()> {
        let record = value.map(|v| (v, RecordType::Insert));
        self.write_record(key, record, log)
    }

    /// [`Core::write_logging`] of a value in the form `record` gives: `(bytes, Insert)`
    /// for a value inline, `(reference, InsertExternal)` for one in the value store,
    /// `None` for a delete. The value store hears of the new reference once the record
    /// is placed, and of the reference of the version it shadows in the mini-page
    /// (`values.rs`; the leaf page's version is found by the next merge).
    pub(super) fn write_record(
        &self,
        key: &[u8],
        record: Option<(&[u8], RecordType)>,
        log: &mut dyn FnMut() -> Result<Option<u64>>,
    ) -> Result<()> {
        let (value, record_type) = record.unwrap_or((&[][..], RecordType::Tombstone));
        debug_assert!(record_type.is_dirty());
        let evict_failures = self.pool.evict_failures();
        loop {
            self.check_writable()?;
            let (path, mut page) = self.lock_leaf_of(key, MappingTable::write);
            let stamp = log()?.map_or(DirtyStamp::UNLOGGED, DirtyStamp::logged);
            let shadowed = if self.may_hold_external() {
                self.external_in_mini(&page, key)
            } else {
                None
            };
            match self.put_in_mini(&mut page, path.prefix_len, key, value, record_type) {
                Ok(()) => {
                    // Under the page's lock still: the page the record is in now (a
                    // merge may have split it off to another page, whose records are
                    // then on disk) is stamped before a checkpoint can look at it.
                    page.note_dirty(stamp);
                    if record_type.is_external() {
                        self.host()?.applied(value, key);
                    }
                    if let Some(old) = shadowed {
                        let mut replaced = Replaced::default();
                        replaced.note(
                            key,
                            (RecordType::InsertExternal, &old),
                            (record_type, value),
                        );
                        self.release_replaced(replaced);
                    }
                    return Ok(());
                }
                Err(Op::Fail(e)) => return Err(e),
                Err(Op::Restart) => {
                    drop(page);
                    bump(&self.counters.restarts);
                }
                Err(Op::WouldBlock) => {
                    drop(page);
                    bump(&self.counters.restarts);
                    self.help_evict();
                    // Room cannot be made while evicting dirty mini-pages fails (say, their
                    // leaf pages cannot be read), whichever tree's they are: report it
                    // instead of spinning.
                    if let Some(why) = self.pool.evict_failure_since(evict_failures) {
                        return Err(Error::Io(std::io::Error::other(format!(
                            "no room for the write: evicting a dirty mini-page failed: {why}"
                        ))));
                    }
                }
            }
        }
    }

    /// The reference held by the page's mini-page version of `key`, if that version
    /// keeps its value out of line. The caller holds the page's lock.
    fn external_in_mini(&self, page: &mapping::WriteGuard<'_>, key: &[u8]) -> Option<Vec<u8>> {
        let mini = self.mini_page(page)?.node();
        let i = mini.search(key).ok()?;
        let r = mini.record(i);
        r.record_type().is_external().then(|| r.value().to_vec())
    }

    /// Evicts from the pool's head while holding no page lock: the block that blocked an
    /// allocation may be the caller's own mini-page.
    pub(super) fn help_evict(&self) {
        if !self
            .pool
            .evict_until(self.leaf.max_mini_block_bytes() as u64 * 2)
        {
            crate::sync::thread::yield_now();
        }
    }

    /// Puts one record into the page's mini-page, creating, copying, growing or merging
    /// it as needed (Bf-Tree §5.2). The caller holds the page's write lock.
    pub(super) fn put_in_mini(
        &self,
        page: &mut mapping::WriteGuard<'_>,
        prefix_len: usize,
        key: &[u8],
        value: &[u8],
        record_type: RecordType,
    ) -> Result<(), Op> {
        loop {
            let block = match page.location() {
                Location::Leaf(no) => {
                    return self.create_mini(page, prefix_len, PageNo(no), key, value, record_type);
                }
                Location::Mini(offset) => self.block(offset),
                Location::Empty => unreachable!("a routed page id is in use"),
            };
            // Nothing in the mini-page was worth keeping when `copy_to_tail` answers
            // `None`: the page maps to its leaf page now, and the next turn creates a
            // mini-page for the record.
            if !self.pool.in_copy_on_access_region(&block) || self.copy_to_tail(page).is_some() {
                break;
            }
        }
        let mut mini_page = self.mini_page_mut(page).expect("the page maps a mini-page");
        let (block, header) = (mini_page.block(), mini_page.header());
        let mut mini = mini_page.node_mut();
        if record_type == RecordType::Tombstone
            && header.mirror
            && mini.as_ref().search(key).is_err()
        {
            // A mirror holds every record of its leaf: the key is absent already.
            return Ok(());
        }
        if place(&mut mini, key, value, record_type) {
            return Ok(());
        }
        let node_size = block.size_bytes() - MINI_HEADER_BYTES;
        let can_grow = !header.mirror && block.size_bytes() < self.leaf.max_mini_block_bytes();
        if can_grow && node_size < self.config.merge_threshold_bytes {
            return self.grow_mini(page, header, key, value, record_type);
        }
        // At the merge threshold. For a write, clean records not read since the last pass
        // go first: dropping them costs no IO (a merge leaves the records it wrote as
        // clean copies, so without this the next new key merged again, for that one
        // record). A read being cached does not displace them; `merge_full` drops it.
        if !header.mirror
            && record_type.is_dirty()
            && drop_cold_clean(&mut mini)
            && place(&mut mini, key, value, record_type)
        {
            return Ok(());
        }
        // At the merge threshold. With a background evictor, a write grows the mini-page
        // on and leaves the merge to it (batched, and the writer does not wait for the
        // leaf IO); at full size, or without one, the writer merges now.
        if can_grow && record_type.is_dirty() && self.queue_merge(page.id()) {
            return self.grow_mini(page, header, key, value, record_type);
        }
        self.merge_full(page, header, key, value, record_type)
    }

    /// Moves the page's mini-page into a bigger block and places the record
    /// there, growing again while a large record still does not fit; at full size, or
    /// when the pool has no room, merges instead. The caller holds the page's write lock.
    pub(super) fn grow_mini(
        &self,
        page: &mut mapping::WriteGuard<'_>,
        header: MiniHeader,
        key: &[u8],
        value: &[u8],
        record_type: RecordType,
    ) -> Result<(), Op> {
        loop {
            let old_page = self.mini_page(page).expect("the page maps a mini-page");
            let (block, old) = (old_page.block(), old_page.node());
            let live_bytes = old.node_size_bytes() - old.reclaimable_space_bytes();
            // Room for the new record for sure (its full key bounds its stored suffix), and
            // otherwise a fixed step up: small steps keep the block's empty tail small.
            let need = MINI_HEADER_BYTES + live_bytes + leaf::record_cost(key.len(), value.len());
            let stepped = block.size_bytes() * MINI_GROWTH_PERCENT / 100;
            let bigger = match self.alloc(need.max(stepped).min(self.leaf.max_mini_block_bytes())) {
                Ok(b) => b,
                // No room: the block pinning the pool's head may be this very mini-page,
                // which nobody can evict while we hold its page. A merge needs no pool room.
                Err(Op::WouldBlock) if record_type.is_dirty() => {
                    bump(&self.counters.merges_without_room);
                    return self.merge_full(page, header, key, value, record_type);
                }
                Err(e) => return Err(e),
            };
            let mut bigger = bigger;
            let new = bigger.bytes_mut();
            header.write(new);
            let mut mini =
                node::copy_into(&old, &mut new[MINI_HEADER_BYTES..], old.fences(), |_| true)
                    .expect("a bigger block holds the old node's live records");
            let placed = match mini.upsert(key, value, record_type) {
                Ok(up) => {
                    mini.set_ref_bit(up.index(), record_type.is_dirty());
                    true
                }
                Err(_) => false,
            };
            let bigger = self.publish(page, bigger);
            self.retire(block);
            bump(&self.counters.mini_page_growths);
            if placed {
                return Ok(());
            }
            if bigger.size_bytes() >= self.leaf.max_mini_block_bytes() {
                // Full size and still no room: merge now. (Leaving it to the next attempt
                // could loop: in the copy-on-access region that attempt copies the block,
                // which can shrink it below full size, so it would grow again instead.)
                return self.merge_full(page, header, key, value, record_type);
            }
            // Still no room (a large record): keep growing from the bigger block.
        }
    }
}
