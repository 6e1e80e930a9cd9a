//! Unit tests of the pool's internals: size classes, wrap-around with pads, states.

use super::*;

fn tiny(capacity_bytes: u64, max_block_size_bytes: u32) -> Pool {
    Pool::new(PoolConfig {
        capacity_bytes,
        copy_on_access_percent: 0,
        huge_pages: false,
        max_block_size_bytes,
    })
    .unwrap()
}

fn header_of(pool: &Pool, block: &Block) -> Header {
    // SAFETY: single-threaded test; the block is allocated, so the word is its header.
    unsafe { pool.region.load_header(block.offset()) }
}

fn evict_all(_: &Block) -> EvictDecision {
    EvictDecision::Evicted
}

#[test]
fn size_classes_round_up_to_quarter_steps() {
    let pool = tiny(1 << 16, 4096);
    for (asked, class) in [
        (0, 64),
        (1, 64),
        (64, 64),
        (65, 80),
        (80, 80),
        (113, 128),
        (129, 160),
        (200, 224),
        (225, 256),
        (2048, 2048),
        (2049, 2560),
        (3585, 4096),
        (4096, 4096),
    ] {
        assert_eq!(
            pool.class_size_bytes(asked),
            Ok(class),
            "request of {asked} bytes"
        );
        assert_eq!(pool.try_alloc(asked).unwrap().size_bytes(), class);
    }
    assert_eq!(
        pool.class_size_bytes(4097),
        Err(AllocError::TooLarge {
            size_bytes: 4097,
            max_bytes: 4096
        })
    );
    assert_eq!(
        pool.try_alloc(4097),
        Err(AllocError::TooLarge {
            size_bytes: 4097,
            max_bytes: 4096
        })
    );
}

#[test]
fn every_class_is_at_most_a_quarter_above_the_one_below() {
    let classes = class_of(4096) + 1;
    assert_eq!(classes, 6 * CLASSES_PER_DOUBLING + 1);
    let sizes: Vec<u32> = (0..classes).map(class_size_bytes).collect();
    assert_eq!(sizes[0], MIN_BLOCK_SIZE_BYTES);
    assert_eq!(sizes[classes - 1], 4096);
    for pair in sizes.windows(2) {
        assert!(pair[0] < pair[1] && pair[1] * 4 <= pair[0] * 5, "{pair:?}");
        assert!(pair[1].is_multiple_of(8), "blocks stay 8-byte aligned");
    }
    // Every request maps to the smallest class that holds it.
    for size in 0..=4096usize {
        let class = class_of(size);
        assert!(class_size_bytes(class) as usize >= size, "{size}");
        assert!(
            class == 0 || (class_size_bytes(class - 1) as usize) < size,
            "{size}"
        );
    }
}

#[test]
fn config_validation_rejects_nonsense() {
    let ok = PoolConfig::with_capacity(1 << 20);
    assert!(ok.validate().is_ok());
    let bad = [
        PoolConfig {
            capacity_bytes: (1 << 20) + 4,
            ..ok.clone()
        },
        PoolConfig {
            capacity_bytes: 8200,
            ..ok.clone()
        }, // < 2 * (4096 + 8)
        PoolConfig {
            capacity_bytes: MAX_CAPACITY_BYTES + 8,
            ..ok.clone()
        },
        PoolConfig {
            copy_on_access_percent: 101,
            ..ok.clone()
        },
        PoolConfig {
            max_block_size_bytes: 3000,
            ..ok.clone()
        },
        PoolConfig {
            max_block_size_bytes: 32,
            ..ok.clone()
        },
        PoolConfig {
            max_block_size_bytes: 1 << 24,
            capacity_bytes: 1 << 26,
            ..ok.clone()
        },
    ];
    for config in bad {
        assert!(
            matches!(config.validate(), Err(PoolError::InvalidConfig(_))),
            "{config:?} was accepted"
        );
        assert!(Pool::new(config).is_err());
    }
    assert!(
        PoolConfig {
            capacity_bytes: 8208,
            ..ok
        }
        .validate()
        .is_ok()
    );
}

#[test]
fn blocks_are_contiguous_with_header_before_payload() {
    let pool = tiny(4096, 256);
    let a = pool.try_alloc(64).unwrap();
    let b = pool.try_alloc(250).unwrap();
    assert_eq!(b.size_bytes(), 256);
    assert_eq!(a.addr(), 0);
    assert_eq!(a.payload_ptr() as usize % 8, 0);
    assert_eq!(b.addr(), 8 + 64);
    assert_eq!(b.payload_ptr() as usize - a.payload_ptr() as usize, 64 + 8);
    assert_eq!(header_of(&pool, &a), Header::new(64, State::Reserved, 0));
    // SAFETY: `a` was just allocated and is published once.
    unsafe { pool.publish(&a) };
    assert_eq!(header_of(&pool, &a).state(), Some(State::Live));
    assert_eq!(pool.stats().bytes_in_use, 72 + 264);
    assert_eq!(pool.addresses().tail, 72 + 264);
}

#[test]
fn wrap_around_writes_a_pad_block_and_uses_the_next_lap() {
    // Capacity 1024: blocks of 264 bytes; three fit (792), the fourth would cross the end.
    let pool = tiny(1024, 256);
    let blocks: Vec<Block> = (0..3).map(|_| pool.try_alloc(256).unwrap()).collect();
    for b in &blocks {
        // SAFETY: freshly allocated blocks, published once.
        unsafe { pool.publish(b) };
    }
    assert_eq!(
        pool.try_alloc(256),
        Err(AllocError::Full),
        "pad 232 + 264 exceeds the room"
    );
    // Evict the first block: head moves to 264, room is 264 + 232 = 496 >= pad + block.
    assert!(matches!(
        pool.evict_one(&evict_all),
        EvictResult::Reclaimed { evicted: true, .. }
    ));
    assert_eq!(pool.addresses().head, 264);
    let wrapped = pool.try_alloc(256).unwrap();
    assert_eq!(wrapped.addr(), 1024, "the block starts the next lap");
    assert_eq!(wrapped.offset(), 0);
    assert_eq!(
        header_of(&pool, &wrapped),
        Header::new(256, State::Reserved, 1)
    );
    // The pad fills [792, 1024).
    // SAFETY: single-threaded; the pad's header word is at 792.
    let pad = unsafe { pool.region.load_header(792) };
    assert_eq!(pad, Header::new(1024 - 792 - 8, State::Pad, 0));
    let a = pool.addresses();
    assert_eq!(a.tail, 1024 + 264);
    assert!(a.tail - a.head <= 1024);
    // The reclaimed block's memory was zeroed before reuse.
    // SAFETY: `wrapped` is allocated and only this thread touches it.
    assert!(unsafe { wrapped.payload() }.iter().all(|&b| b == 0));
    // Evicting the rest reclaims the two blocks and the pad, then the wrapped block.
    let report = pool.drain(&evict_all);
    assert_eq!(report.reclaimed_blocks, 3, "{report:?}"); // two blocks and the pad; `wrapped` is Reserved
    assert_eq!(report.busy_blocks, 1);
    assert_eq!(pool.addresses().head, 1024);
    // SAFETY: `wrapped` is Reserved and ours.
    unsafe { pool.publish(&wrapped) };
    let report = pool.drain(&evict_all);
    assert_eq!(report.evicted_blocks, 1);
    let a = pool.addresses();
    assert_eq!(
        (a.head, a.evict_cursor, a.tail),
        (1024 + 264, 1024 + 264, 1024 + 264)
    );
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn free_in_place_reuses_through_the_free_list_exactly() {
    let pool = tiny(4096, 256);
    let a = pool.try_alloc(100).unwrap();
    let b = pool.try_alloc(100).unwrap();
    // SAFETY: allocated by this pool, freed once, never touched again.
    unsafe { pool.free(a) };
    assert_eq!(header_of(&pool, &a).state(), Some(State::Free));
    let c = pool.try_alloc(112).unwrap();
    assert_eq!(c.addr(), a.addr(), "same class comes from the free list");
    assert_eq!(header_of(&pool, &c).state(), Some(State::Reserved));
    let d = pool.try_alloc(64).unwrap();
    assert!(d.addr() > b.addr(), "another class comes from the tail");
    let s = pool.stats();
    assert_eq!(
        (s.allocs_from_free_list, s.allocs_from_tail, s.frees),
        (1, 3, 1)
    );
}

#[test]
fn evicting_a_free_block_unlinks_it_so_it_is_never_handed_out() {
    let pool = tiny(1024, 256);
    let a = pool.try_alloc(64).unwrap();
    // SAFETY: allocated by this pool, freed once.
    unsafe { pool.free(a) };
    assert_eq!(pool.free_lists.len(0), 1);
    assert!(matches!(
        pool.evict_one(&evict_all),
        EvictResult::Reclaimed { evicted: false, .. }
    ));
    assert_eq!(pool.free_lists.len(0), 0);
    assert_eq!(pool.addresses().head, 72);
    let b = pool.try_alloc(64).unwrap();
    assert_ne!(b.addr(), a.addr());
}

#[test]
fn free_of_claimed_or_copy_on_access_block_marks_it_dead() {
    let pool = Pool::new(PoolConfig {
        capacity_bytes: 1024,
        copy_on_access_percent: 50,
        huge_pages: false,
        max_block_size_bytes: 256,
    })
    .unwrap();
    let blocks: Vec<Block> = (0..3).map(|_| pool.try_alloc(256).unwrap()).collect();
    // tail = 792, in-place bytes = 512, so second chance = 280: blocks 0 (at 0) and 1
    // (at 264) are copy-on-access, block 2 (at 528) is in place.
    assert_eq!(pool.addresses().second_chance, 280);
    assert!(pool.in_copy_on_access_region(&blocks[0]));
    assert!(pool.in_copy_on_access_region(&blocks[1]));
    assert!(!pool.in_copy_on_access_region(&blocks[2]));
    // SAFETY: allocated by this pool, freed once.
    unsafe { pool.free(blocks[0]) };
    assert_eq!(header_of(&pool, &blocks[0]).state(), Some(State::Dead));
    // SAFETY: as above.
    unsafe { pool.free(blocks[2]) };
    assert_eq!(header_of(&pool, &blocks[2]).state(), Some(State::Free));
    // Once the evictor has claimed block 1, its free marks it Dead whatever the region.
    let none_evicted = |_: &Block| EvictDecision::Busy;
    assert!(matches!(
        pool.evict_one(&none_evicted),
        EvictResult::Reclaimed { evicted: false, .. }
    ));
    assert_eq!(pool.evict_one(&none_evicted), EvictResult::Busy);
    assert_eq!(header_of(&pool, &blocks[1]).state(), Some(State::Reserved));
    // SAFETY: as above.
    unsafe { pool.free(blocks[1]) };
    assert_eq!(header_of(&pool, &blocks[1]).state(), Some(State::Dead));
}

#[test]
fn busy_block_goes_back_to_live_and_is_retried_first() {
    let pool = tiny(1024, 256);
    let a = pool.try_alloc(64).unwrap();
    let b = pool.try_alloc(64).unwrap();
    // SAFETY: freshly allocated, published once each.
    unsafe {
        pool.publish(&a);
        pool.publish(&b);
    }
    let busy_a = |blk: &Block| {
        if blk.addr() == a.addr() {
            EvictDecision::Busy
        } else {
            EvictDecision::Evicted
        }
    };
    assert_eq!(pool.evict_one(&busy_a), EvictResult::Busy);
    assert_eq!(header_of(&pool, &a).state(), Some(State::Live));
    // The retry of `a` is busy again, then `b` is claimed and evicted; the head stays.
    assert!(matches!(
        pool.evict_one(&busy_a),
        EvictResult::Reclaimed { evicted: true, .. }
    ));
    assert_eq!(pool.addresses().head, 0);
    assert_eq!(pool.addresses().evict_cursor, 144);
    // Once `a` is evictable, the head moves past both.
    assert!(matches!(
        pool.evict_one(&evict_all),
        EvictResult::Reclaimed { evicted: true, .. }
    ));
    assert_eq!(pool.addresses().head, 144);
    assert_eq!(pool.evict_one(&evict_all), EvictResult::Empty);
    assert_eq!(pool.stats().busy_retries, 2);
}

#[test]
fn free_during_eviction_is_not_lost() {
    // The callback frees the block it is asked to evict (a late free by its client) and
    // then answers Busy: the pool must reclaim it rather than put it back to Live.
    let pool = tiny(1024, 256);
    let a = pool.try_alloc(64).unwrap();
    // SAFETY: freshly allocated, published once.
    unsafe { pool.publish(&a) };
    let freeing = |blk: &Block| {
        // SAFETY: the test's client gives the block up here and never touches it again.
        unsafe { pool.free(*blk) };
        EvictDecision::Busy
    };
    assert!(matches!(
        pool.evict_one(&freeing),
        EvictResult::Reclaimed { evicted: false, .. }
    ));
    assert_eq!(pool.addresses().head, 72);
    let s = pool.stats();
    assert_eq!((s.frees, s.evictions, s.bytes_in_use), (1, 0, 0));
}

#[test]
fn block_at_validates_against_the_header() {
    let pool = tiny(1024, 256);
    let a = pool.try_alloc(64).unwrap();
    let b = pool.try_alloc(128).unwrap();
    // SAFETY: offsets of allocated blocks, single-threaded.
    unsafe {
        assert_eq!(pool.block_at(a.offset()), Some(a));
        assert_eq!(pool.block_at(b.offset()), Some(b));
        // Misaligned or out of range offsets are rejected without reading.
        assert_eq!(pool.block_at(3), None);
        assert_eq!(pool.block_at(1024), None);
    }
    // SAFETY: freed once; afterwards its offset is looked up only while still unreclaimed.
    unsafe {
        pool.free(a);
        assert_eq!(
            pool.block_at(a.offset()),
            None,
            "a free block is not a live handle"
        );
    }
}

#[test]
fn reserved_block_is_never_evicted() {
    let pool = tiny(1024, 256);
    let a = pool.try_alloc(256).unwrap();
    let report = pool.drain(&evict_all);
    assert_eq!(
        report,
        DrainReport {
            reclaimed_blocks: 0,
            evicted_blocks: 0,
            busy_blocks: 1
        }
    );
    assert_eq!(header_of(&pool, &a).state(), Some(State::Reserved));
    // SAFETY: allocated, freed once.
    unsafe { pool.free(a) };
    assert_eq!(pool.drain(&evict_all).reclaimed_blocks, 1);
}

/// Asserts the zero invariant: every byte physically outside `[head, tail)` is zero.
fn assert_zero_outside_window(pool: &Pool) {
    let a = pool.addresses();
    let cap = pool.capacity_bytes;
    for logical in a.tail..a.head + cap {
        let offset = logical % cap;
        // SAFETY: single-threaded test; these bytes are outside every block.
        let byte = unsafe { pool.region.ptr_at(offset).as_ptr().read() };
        assert_eq!(
            byte, 0,
            "byte at offset {offset} outside [{}, {}) is not zero",
            a.head, a.tail
        );
    }
}

#[test]
fn in_flight_allocation_over_stale_bytes_reads_as_in_flight() {
    let pool = tiny(1024, 256);
    // Lap 0: three 256-byte blocks full of 0xff, then evicted.
    for _ in 0..3 {
        let b = pool.try_alloc(256).unwrap();
        // SAFETY: Reserved and ours; published once.
        unsafe {
            b.payload_mut().fill(0xff);
            pool.publish(&b);
        }
    }
    assert_eq!(pool.drain(&evict_all).evicted_blocks, 3);
    assert_zero_outside_window(&pool);
    // 64-byte blocks up to the end of lap 0 (792, 864, 936), then a pad and one at 1024.
    let mut last = None;
    for _ in 0..4 {
        let b = pool.try_alloc(64).unwrap();
        // SAFETY: Reserved and ours; published once.
        unsafe { pool.publish(&b) };
        last = Some(b);
    }
    assert_eq!(last.unwrap().addr(), 1024);
    // An allocator bumps the tail over offset 72 (inside lap 0's first payload, which
    // held 0xff) and is preempted before writing the header.
    let t = pool.tail.load(Ordering::Acquire);
    assert_eq!(t, 1096);
    assert!(
        pool.tail
            .compare_exchange(t, t + 72, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    );
    // The evictor reclaims up to it, then must see "in flight", not a garbage header.
    let mut results = Vec::new();
    loop {
        let r = pool.evict_one(&evict_all);
        results.push(r);
        if r != (EvictResult::Reclaimed {
            block_bytes: 72,
            evicted: true,
        }) && !matches!(r, EvictResult::Reclaimed { evicted: false, .. })
        {
            break;
        }
    }
    assert_eq!(results.last(), Some(&EvictResult::InFlight), "{results:?}");
    assert_eq!(pool.addresses().head, 1096);
    // The allocator wakes up and publishes its header; eviction proceeds.
    let header = Header::new(64, State::Live, 1);
    // SAFETY: single-threaded test standing in for the allocator; offset 72 is its header.
    unsafe { pool.region.header(72) }.store(header.0, std::sync::atomic::Ordering::Release);
    assert_eq!(
        pool.evict_one(&evict_all),
        EvictResult::Reclaimed {
            block_bytes: 72,
            evicted: true
        }
    );
    assert_zero_outside_window(&pool);
}

#[test]
fn random_operations_keep_memory_outside_the_window_zero() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("seed = {seed}");
    let mut x = seed | 1;
    let mut rand = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let pool = Pool::new(PoolConfig {
        capacity_bytes: 2048,
        copy_on_access_percent: 20,
        huge_pages: false,
        max_block_size_bytes: 512,
    })
    .unwrap();
    // The test's blocks; its evictor refuses every third address and forgets the rest.
    let held = std::cell::RefCell::new(std::collections::BTreeMap::<u64, Block>::new());
    let sometimes_busy = |b: &Block| {
        if b.addr().is_multiple_of(3) {
            EvictDecision::Busy
        } else {
            assert!(
                held.borrow_mut().remove(&b.addr()).is_some(),
                "callback for unknown {b:?}"
            );
            EvictDecision::Evicted
        }
    };
    for _ in 0..3000 {
        match rand(4) {
            0 | 1 => {
                if let Ok(b) = pool.alloc(1 + rand(512) as usize, &sometimes_busy) {
                    // SAFETY: Reserved and ours; published once.
                    unsafe {
                        b.payload_mut().fill(0xa5);
                        pool.publish(&b);
                    }
                    held.borrow_mut().insert(b.addr(), b);
                }
            }
            2 => {
                let n = held.borrow().len() as u64;
                if n > 0 {
                    let addr = *held.borrow().keys().nth(rand(n) as usize).unwrap();
                    let b = held.borrow_mut().remove(&addr).unwrap();
                    // SAFETY: allocated, not evicted (the evictor forgets those), freed once.
                    unsafe { pool.free(b) };
                }
            }
            _ => {
                let _ = pool.evict_one(&sometimes_busy);
            }
        }
        assert_zero_outside_window(&pool);
    }
}

/// An evictor that records the batches it is handed and answers `Busy` for one block.
struct BatchRecorder {
    busy_addr: u64,
    batches: std::sync::Mutex<Vec<Vec<u64>>>,
}

impl Evictor for BatchRecorder {
    fn evict(&self, block: &Block) -> EvictDecision {
        self.evict_batch(std::slice::from_ref(block))[0]
    }

    fn evict_batch(&self, blocks: &[Block]) -> Vec<EvictDecision> {
        self.batches
            .lock()
            .unwrap()
            .push(blocks.iter().map(Block::addr).collect());
        blocks
            .iter()
            .map(|b| {
                if b.addr() == self.busy_addr {
                    EvictDecision::Busy
                } else {
                    EvictDecision::Evicted
                }
            })
            .collect()
    }
}

#[test]
fn evict_many_hands_live_blocks_over_in_one_batch() {
    let pool = tiny(4096, 256);
    let blocks: Vec<Block> = (0..6).map(|_| pool.try_alloc(64).unwrap()).collect();
    // 0 live, 1 live (busy), 2 freed, 3 reserved (never published yet), 4 and 5 live.
    // SAFETY: each block is published or freed once, by this single thread.
    unsafe {
        for i in [0, 1, 4, 5] {
            pool.publish(&blocks[i]);
        }
        pool.free(blocks[2]);
    }
    let recorder = BatchRecorder {
        busy_addr: blocks[1].addr(),
        batches: std::sync::Mutex::new(Vec::new()),
    };
    // Two blocks fewer than there are: the cursor stops after block 3.
    assert_eq!(pool.evict_many(4, &recorder), 2, "blocks 0 and 2");
    assert_eq!(
        *recorder.batches.lock().unwrap(),
        vec![vec![blocks[0].addr(), blocks[1].addr()]],
        "one call, live blocks in address order"
    );
    assert_eq!(header_of(&pool, &blocks[1]).state(), Some(State::Live));
    assert_eq!(header_of(&pool, &blocks[3]).state(), Some(State::Reserved));
    // The head passed block 0 only: block 1 is busy and holds it back.
    assert_eq!(pool.addresses().head, blocks[1].addr());
    // Next step: block 1 (the oldest busy one) is retried alone and is busy again; then
    // blocks 4 and 5 go in one batch.
    assert_eq!(pool.evict_many(8, &recorder), 2);
    assert_eq!(
        recorder.batches.lock().unwrap()[1..],
        [
            vec![blocks[1].addr()],
            vec![blocks[4].addr(), blocks[5].addr()]
        ]
    );
    assert_eq!(pool.addresses().head, blocks[1].addr());
    // SAFETY: block 3 is still Reserved and ours.
    unsafe { pool.publish(&blocks[3]) };
    let report = pool.drain(&evict_all);
    assert_eq!(report.busy_blocks, 0);
    assert_eq!(pool.addresses().head, pool.addresses().tail);
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn panicking_batch_callback_puts_every_block_back() {
    let pool = tiny(4096, 256);
    let blocks: Vec<Block> = (0..3).map(|_| pool.try_alloc(64).unwrap()).collect();
    for b in &blocks {
        // SAFETY: each block published once.
        unsafe { pool.publish(b) };
    }
    struct Panics;
    impl Evictor for Panics {
        fn evict(&self, _: &Block) -> EvictDecision {
            panic!("callback failure")
        }
        fn evict_batch(&self, _: &[Block]) -> Vec<EvictDecision> {
            panic!("batch callback failure")
        }
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.evict_many(8, &Panics);
    }));
    assert!(result.is_err());
    for b in &blocks {
        assert_eq!(header_of(&pool, b).state(), Some(State::Live));
    }
    assert_eq!(pool.addresses().head, 0);
    let report = pool.drain(&evict_all);
    assert_eq!(report.evicted_blocks, 3);
    assert_eq!(pool.addresses().head, pool.addresses().tail);
}

/// Bytes of the region's pages that are resident (`mincore`).
fn resident_bytes(pool: &Pool) -> u64 {
    let page = 4096usize;
    let len = pool.capacity_bytes as usize;
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: the range is exactly the pool's mapping; mincore only writes `vec`, one
    // byte per page.
    let rc = unsafe { libc::mincore(pool.region.ptr_at(0).as_ptr().cast(), len, vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().filter(|&&v| v & 1 == 1).count() as u64 * page as u64
}

/// Fills `block`'s payload with a pattern of its address.
fn stamp(block: &Block) {
    // SAFETY: the caller owns the block (Reserved, not yet published).
    let payload = unsafe { block.payload_mut() };
    for (i, chunk) in payload.chunks_mut(8).enumerate() {
        let word = (block.addr() ^ i as u64).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// Whether `block`'s payload still holds `stamp`'s pattern.
fn stamped(block: &Block) -> bool {
    // SAFETY: the block is live and only this single-threaded test touches it.
    let payload = unsafe { block.payload() };
    payload
        .chunks(8)
        .enumerate()
        .all(|(i, chunk)| chunk == &(block.addr() ^ i as u64).to_le_bytes()[..chunk.len()])
}

#[test]
fn a_lower_limit_bounds_the_window_and_gives_back_memory_the_head_passed() {
    const MIB: u64 = 1 << 20;
    let pool = Pool::new(PoolConfig {
        capacity_bytes: 16 * MIB,
        copy_on_access_percent: 10,
        huge_pages: false,
        max_block_size_bytes: 4096,
    })
    .unwrap();
    assert_eq!(pool.set_limit_bytes(1), pool.min_limit_bytes());
    assert_eq!(pool.set_limit_bytes(u64::MAX), 16 * MIB);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    // Blocks the test holds; the evictor checks each is intact before forgetting it,
    // so memory given back under a live block (it would read as zeros) fails here.
    let held = std::cell::RefCell::new(std::collections::BTreeMap::<u64, Block>::new());
    let checked = |b: &Block| {
        assert!(stamped(b), "{b:?} lost its bytes");
        assert!(held.borrow_mut().remove(&b.addr()).is_some());
        EvictDecision::Evicted
    };
    let mut churn = |pool: &Pool, bytes: u64| {
        let start = pool.stats().tail_bytes;
        while pool.stats().tail_bytes - start < bytes {
            if rand(8) == 0 && !held.borrow().is_empty() {
                let n = held.borrow().len() as u64;
                let addr = *held.borrow().keys().nth(rand(n) as usize).unwrap();
                let b = held.borrow_mut().remove(&addr).unwrap();
                assert!(stamped(&b), "{b:?} lost its bytes");
                // SAFETY: allocated, not evicted (the evictor forgets those), freed once.
                unsafe { pool.free(b) };
                continue;
            }
            let b = pool.alloc(1 + rand(4096) as usize, &checked).unwrap();
            stamp(&b);
            // SAFETY: Reserved and ours; published once.
            unsafe { pool.publish(&b) };
            held.borrow_mut().insert(b.addr(), b);
            let a = pool.addresses();
            assert!(a.tail - a.head <= pool.limit_bytes(), "{a:?}");
        }
    };
    // A full first lap touches the whole region.
    churn(&pool, 20 * MIB);
    assert!(resident_bytes(&pool) > 15 * MIB);
    assert_eq!(
        pool.stats().released_bytes,
        0,
        "nothing given back at the capacity"
    );
    // A quarter of it: eviction brings the window within the limit at once, and after
    // a turn of the buffer what lies outside the window has gone back.
    assert_eq!(pool.set_limit_bytes(4 * MIB), 4 * MIB);
    churn(&pool, 40 * MIB);
    let resident = resident_bytes(&pool);
    assert!(
        resident <= 4 * MIB + 3 * super::evict::RELEASE_CHUNK_BYTES,
        "{resident} bytes resident under a 4 MiB limit"
    );
    assert!(pool.stats().released_bytes >= 16 * MIB);
    for b in held.borrow().values() {
        assert!(stamped(b), "{b:?} lost its bytes");
    }
    assert_zero_outside_window(&pool);
    // Back to the capacity: the window may span it all again.
    pool.set_limit_bytes(16 * MIB);
    churn(&pool, 40 * MIB);
    let a = pool.addresses();
    assert!(a.tail - a.head > 8 * MIB, "{a:?}");
    for b in held.borrow().values() {
        assert!(stamped(b), "{b:?} lost its bytes");
    }
    assert_zero_outside_window(&pool);
}

/// The CI flake of `tree_concurrent::overlapping_writers_8_threads` ("free list holds a
/// block ... that is not Free: Header(0)"), made deterministic. A pop that skips a
/// listed block near the head turns it `Dead`, and from that instant the block's
/// evictor may reclaim it without the list mutex: zero its payload, where the list links
/// live, and let the head pass it. The hook runs that whole eviction inside the window
/// (as a preempted allocator on an oversubscribed machine would let it); the pop must
/// have unlinked the block before, or it unlinks through zeroed links and leaves the
/// reclaimed block at the front of the list.
#[test]
fn pop_skip_unlinks_before_an_evictor_can_reclaim_the_block() {
    let pool = std::sync::Arc::new(
        Pool::new(PoolConfig {
            capacity_bytes: 1024,
            copy_on_access_percent: 50,
            huge_pages: false,
            max_block_size_bytes: 256,
        })
        .unwrap(),
    );
    // Freed while the buffer is nearly empty, so in the in-place region: listed.
    let a = pool.try_alloc(64).unwrap();
    // SAFETY: allocated by this pool, freed once.
    unsafe { pool.free(a) };
    assert_eq!(header_of(&pool, &a).state(), Some(State::Free));
    // The tail moves on (tail 600, in-place bytes 512): `a` is now copy-on-access, so
    // the next pop of its class skips it.
    let _b = pool.try_alloc(256).unwrap();
    let _c = pool.try_alloc(256).unwrap();
    assert!(pool.in_copy_on_access_region(&a));
    let evictor = std::sync::Arc::downgrade(&pool);
    *pool.free_lists.after_leave_free_hook.lock() = Some(Box::new(move |addr| {
        let pool = evictor.upgrade().expect("the test holds the pool");
        assert_eq!(addr, 0, "the skipped block is `a`");
        // The evictor claims the block the pop just made Dead and reclaims it at once.
        assert_eq!(
            pool.evict_one(&evict_all),
            EvictResult::Reclaimed {
                block_bytes: 72,
                evicted: false
            }
        );
    }));
    let d = pool.try_alloc(64).unwrap();
    *pool.free_lists.after_leave_free_hook.lock() = None;
    assert_eq!(
        d.addr(),
        600,
        "the skipped block is not handed out: the tail is"
    );
    assert_eq!(pool.addresses().head, 72, "the skipped block was reclaimed");
    assert_eq!(pool.free_lists.len(0), 0);
    assert_zero_outside_window(&pool);
    // The list is intact: it takes and hands back a block as before.
    // SAFETY: allocated by this pool, freed once.
    unsafe { pool.free(d) };
    assert_eq!(pool.try_alloc(64).unwrap().addr(), d.addr());
    assert_eq!(pool.free_lists.len(0), 0);
}
