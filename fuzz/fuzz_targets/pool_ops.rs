//! Model-based fuzzing of the circular-buffer [`Pool`]: alloc / publish / free / evict /
//! drain / copy-on-access sequences on tiny buffers, with a scripted evictor.
//!
//! The model holds every block the pool has handed out and not taken back, with the
//! byte pattern written into it. After every operation the pool must agree: the
//! address invariants hold, model blocks lie inside `[head, tail)`, are physically
//! disjoint and inside the region, their payloads are untouched, `block_at` finds each
//! of them, `bytes_in_use` equals their footprint, and the evictor is only ever called
//! for published model blocks. At the end everything is given back and a drain must
//! leave the buffer empty.

#![no_main]

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use bfdb::pool::{AllocError, Block, EvictDecision, EvictResult, Evictor, Pool, PoolConfig};
use libfuzzer_sys::fuzz_target;

/// Bytes of a block header (the pool's layout; checked through `bytes_in_use`).
const HEADER_BYTES: u64 = 8;

const MAX_OPS: usize = 512;

#[derive(Arbitrary, Debug)]
struct Input {
    /// log2(max block / 64): 64 .. 4096 bytes.
    max_block_shift: u8,
    /// Capacity in 8-byte words beyond the minimum.
    extra_words: u16,
    copy_on_access_percent: u8,
    /// The evictor's answers, cycled: `true` evicts, `false` says busy.
    answers: Vec<bool>,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// Allocate `size` bytes; through `alloc` (which may evict) or `try_alloc`.
    Alloc {
        size: u16,
        fill: u8,
        evict: bool,
    },
    Publish(u16),
    Free(u16),
    EvictOne,
    EvictUntil(u16),
    /// Access a block as the tree does: copy it to the tail if it is in the
    /// copy-on-access region, else rewrite it in place.
    Touch(u16, u8),
    Drain,
    /// Look a model block up by its physical offset (`block_at`'s contract allows only
    /// offsets of allocated blocks, so arbitrary offsets are not asked about).
    Lookup(u16),
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    block: Block,
    fill: u8,
    published: bool,
}

fn footprint(block: &Block) -> u64 {
    HEADER_BYTES + block.size_bytes() as u64
}

/// Fills a payload: its address as an 8-byte tag, then `fill` bytes.
fn write_pattern(block: &Block, fill: u8) {
    // SAFETY: the harness is single-threaded and the block is allocated (in the model),
    // so nobody else accesses the payload.
    let p = unsafe { block.payload_mut() };
    p[..8].copy_from_slice(&block.addr().to_le_bytes());
    p[8..].fill(fill);
}

fn check_pattern(block: &Block, fill: u8) {
    // SAFETY: single-threaded; the block is allocated (in the model) and not written.
    let p = unsafe { block.payload() };
    assert_eq!(p[..8], block.addr().to_le_bytes(), "tag of {block:?}");
    if let Some(i) = p[8..].iter().position(|&b| b != fill) {
        panic!(
            "{block:?} byte {} is {:#x}, expected {fill:#x}",
            i + 8,
            p[8 + i]
        );
    }
}

struct Model {
    blocks: RefCell<BTreeMap<u64, Entry>>,
    answers: Vec<bool>,
    next_answer: Cell<usize>,
}

impl Evictor for Model {
    fn evict(&self, block: &Block) -> EvictDecision {
        let mut blocks = self.blocks.borrow_mut();
        let entry = *blocks
            .get(&block.addr())
            .unwrap_or_else(|| panic!("evictor called for {block:?}, not a model block"));
        assert_eq!(entry.block, *block);
        assert!(entry.published, "evictor called for unpublished {block:?}");
        check_pattern(block, entry.fill);
        let i = self.next_answer.get();
        self.next_answer.set(i + 1);
        if self.answers[i % self.answers.len()] {
            blocks.remove(&block.addr());
            EvictDecision::Evicted
        } else {
            EvictDecision::Busy
        }
    }
}

impl Model {
    fn nth(&self, i: u16) -> Option<Entry> {
        let blocks = self.blocks.borrow();
        let n = blocks.len();
        (n > 0).then(|| *blocks.values().nth(usize::from(i) % n).unwrap())
    }

    fn add(&self, block: Block, fill: u8) {
        write_pattern(&block, fill);
        let old = self.blocks.borrow_mut().insert(
            block.addr(),
            Entry {
                block,
                fill,
                published: false,
            },
        );
        assert!(old.is_none(), "{block:?} handed out twice");
    }

    fn set_published(&self, addr: u64) {
        self.blocks.borrow_mut().get_mut(&addr).unwrap().published = true;
    }

    fn check(&self, pool: &Pool) {
        let cap = pool.capacity_bytes();
        let a = pool.addresses();
        assert!(
            a.head <= a.evict_cursor && a.evict_cursor <= a.tail,
            "{a:?}"
        );
        assert!(
            a.head <= a.second_chance && a.second_chance <= a.tail,
            "{a:?}"
        );
        assert!(
            a.tail - a.head <= cap,
            "{a:?} spans more than the capacity {cap}"
        );
        let blocks = self.blocks.borrow();
        let mut ranges = Vec::with_capacity(blocks.len());
        for e in blocks.values() {
            let b = e.block;
            assert!(
                b.addr() >= a.head && b.addr() < a.tail,
                "{b:?} outside {a:?}"
            );
            assert_eq!(b.offset(), b.addr() % cap);
            assert!(
                b.offset() + footprint(&b) <= cap,
                "{b:?} runs past the region"
            );
            assert_eq!(b.payload_ptr() as usize % 8, 0, "{b:?} payload misaligned");
            check_pattern(&b, e.fill);
            // SAFETY: the offset is that of an allocated block (the model's).
            assert_eq!(unsafe { pool.block_at(b.offset()) }, Some(b));
            ranges.push((b.offset(), b.offset() + footprint(&b)));
        }
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "blocks overlap: {:?} and {:?}",
                w[0],
                w[1]
            );
        }
        let in_use: u64 = blocks.values().map(|e| footprint(&e.block)).sum();
        assert!(in_use <= cap);
        assert_eq!(pool.stats().bytes_in_use, in_use, "bytes_in_use");
    }
}

fuzz_target!(|input: Input| {
    let max_block = 64u32 << (input.max_block_shift % 7);
    let min_cap = 2 * (HEADER_BYTES + u64::from(max_block));
    let capacity_bytes = min_cap + 8 * u64::from(input.extra_words % 1024);
    let pool = Pool::new(PoolConfig {
        capacity_bytes,
        copy_on_access_percent: input.copy_on_access_percent % 101,
        huge_pages: false,
        max_block_size_bytes: max_block,
    })
    .expect("a valid tiny pool");
    let answers = if input.answers.is_empty() {
        vec![true]
    } else {
        input.answers.clone()
    };
    let model = Model {
        blocks: RefCell::new(BTreeMap::new()),
        answers,
        next_answer: Cell::new(0),
    };
    let alloc = |size: usize, evict: bool| -> Option<Block> {
        let r = if evict {
            pool.alloc(size, &model)
        } else {
            pool.try_alloc(size)
        };
        match r {
            Ok(b) => {
                assert!(b.size_bytes() >= size.max(64), "{b:?} for {size} bytes");
                assert!(
                    b.size_bytes() <= size.max(64) * 5 / 4,
                    "{b:?} for {size} bytes"
                );
                assert_eq!(pool.class_size_bytes(size), Ok(b.size_bytes()));
                Some(b)
            }
            Err(AllocError::TooLarge {
                size_bytes,
                max_bytes,
            }) => {
                assert!(size > max_block as usize);
                assert_eq!((size_bytes, max_bytes), (size, max_block as usize));
                None
            }
            Err(AllocError::Full) => {
                assert!(!evict, "alloc answered Full");
                None
            }
            Err(AllocError::WouldBlock) => {
                assert!(evict, "try_alloc answered WouldBlock");
                None
            }
            Err(e) => panic!("unexpected {e}"),
        }
    };
    for op in input.ops.iter().take(MAX_OPS) {
        match *op {
            Op::Alloc { size, fill, evict } => {
                // Sizes up to twice the largest class, so TooLarge is exercised too.
                let size = usize::from(size) % (2 * max_block as usize + 1);
                if let Some(b) = alloc(size, evict) {
                    model.add(b, fill);
                }
            }
            Op::Publish(i) => {
                if let Some(e) = model.nth(i).filter(|e| !e.published) {
                    // SAFETY: allocated by this pool, not yet published or freed.
                    unsafe { pool.publish(&e.block) };
                    model.set_published(e.block.addr());
                }
            }
            Op::Free(i) => {
                if let Some(e) = model.nth(i) {
                    model.blocks.borrow_mut().remove(&e.block.addr());
                    // SAFETY: allocated, freed once, dropped from the model first.
                    unsafe { pool.free(e.block) };
                }
            }
            Op::EvictOne => {
                let before = pool.stats();
                let r = pool.evict_one(&model);
                let after = pool.stats();
                match r {
                    EvictResult::Reclaimed {
                        block_bytes,
                        evicted,
                    } => {
                        assert!(block_bytes >= HEADER_BYTES && block_bytes <= capacity_bytes);
                        assert_eq!(after.reclaimed_blocks, before.reclaimed_blocks + 1);
                        assert_eq!(after.evictions, before.evictions + u64::from(evicted));
                    }
                    EvictResult::Empty | EvictResult::Busy | EvictResult::InFlight => {
                        assert_eq!(after.reclaimed_blocks, before.reclaimed_blocks);
                        assert_eq!(after.evictions, before.evictions);
                    }
                }
            }
            Op::EvictUntil(n) => {
                let want = u64::from(n) % (capacity_bytes + 1);
                if pool.evict_until(want, &model) {
                    let a = pool.addresses();
                    assert!(
                        capacity_bytes - (a.tail - a.head) >= want,
                        "{a:?} for {want}"
                    );
                }
            }
            Op::Touch(i, fill) => {
                let Some(e) = model.nth(i) else { continue };
                if e.published && pool.in_copy_on_access_region(&e.block) {
                    if let Some(nb) = alloc(e.block.size_bytes(), true) {
                        // Eviction inside `alloc` may have taken the old block meanwhile.
                        if model.blocks.borrow().contains_key(&e.block.addr()) {
                            model.add(nb, fill);
                            // SAFETY: allocated, published once.
                            unsafe { pool.publish(&nb) };
                            model.set_published(nb.addr());
                            model.blocks.borrow_mut().remove(&e.block.addr());
                            // SAFETY: allocated, freed once, dropped from the model.
                            unsafe { pool.free(e.block) };
                        } else {
                            // SAFETY: never published or recorded; freed once.
                            unsafe { pool.free(nb) };
                        }
                    }
                } else {
                    write_pattern(&e.block, fill);
                    model
                        .blocks
                        .borrow_mut()
                        .get_mut(&e.block.addr())
                        .unwrap()
                        .fill = fill;
                }
            }
            Op::Drain => {
                let report = pool.drain(&model);
                assert!(
                    report.evicted_blocks <= report.reclaimed_blocks,
                    "{report:?}"
                );
                // Blocks left busy are model blocks: answered Busy, or reserved again
                // from a free list while on the retry list.
                let held = model.blocks.borrow().len();
                assert!(
                    report.busy_blocks <= held,
                    "{report:?} with {held} model blocks"
                );
            }
            Op::Lookup(i) => {
                if let Some(e) = model.nth(i) {
                    // SAFETY: the offset of an allocated block.
                    let found = unsafe { pool.block_at(e.block.offset()) };
                    assert_eq!(found, Some(e.block));
                }
            }
        }
        model.check(&pool);
    }
    // Give everything back and drain: the buffer must end empty.
    let all: Vec<Entry> = model.blocks.borrow().values().copied().collect();
    for e in all {
        if !e.published {
            model.blocks.borrow_mut().remove(&e.block.addr());
            // SAFETY: allocated, never published, freed once.
            unsafe { pool.free(e.block) };
        }
    }
    let evict_all = |b: &Block| {
        assert!(
            model.blocks.borrow_mut().remove(&b.addr()).is_some(),
            "final drain evicted {b:?}, not a model block"
        );
        EvictDecision::Evicted
    };
    pool.drain(&evict_all);
    assert!(
        model.blocks.borrow().is_empty(),
        "drain left published blocks"
    );
    let a = pool.addresses();
    assert_eq!(
        (a.head, a.evict_cursor),
        (a.tail, a.tail),
        "drain left the buffer non-empty"
    );
    assert_eq!(pool.stats().bytes_in_use, 0);
});
