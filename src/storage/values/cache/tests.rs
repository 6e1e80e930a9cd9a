//! Unit tests of the value cache: hits and ranges, the capacity under random operations
//! (with the structures' real sizes), S3-FIFO's scan resistance and ghosts, the largest
//! entry, invalidation.

use super::*;

/// A reference at block `block` of a value of `len` bytes, its "checksum" `version`.
fn r(block: u64, len: u32, version: u32) -> ValueRef {
    ValueRef {
        offset: block * 4096,
        len,
        crc: version,
    }
}

/// The bytes of the value `r` names: its offset and checksum, repeated.
fn bytes_of(r: &ValueRef) -> Vec<u8> {
    let seed = (r.offset / 4096)
        .wrapping_mul(31)
        .wrapping_add(u64::from(r.crc));
    (0..r.len as u64)
        .map(|i| (seed.wrapping_add(i).wrapping_mul(0x9E37_79B9)) as u8)
        .collect()
}

/// The first `count` blocks whose extents fall in shard `shard`.
fn blocks_in_shard(shard: usize, count: usize) -> Vec<u64> {
    (0..)
        .filter(|&b| shard_of(b * 4096) == shard)
        .take(count)
        .collect()
}

/// A cache whose every shard has `shard_bytes`.
fn cache(shard_bytes: u64) -> ValueCache {
    let c = ValueCache::new();
    c.set_capacity(shard_bytes * SHARDS as u64);
    c
}

fn hit(c: &ValueCache, r: &ValueRef) -> bool {
    let mut out = vec![7; 3];
    let found = c.get(r, &mut out);
    if found {
        assert_eq!(out, bytes_of(r), "a hit copies the whole value");
    } else {
        assert_eq!(out, [7; 3], "a miss leaves the buffer alone");
    }
    found
}

#[test]
fn a_hit_copies_the_whole_value_or_a_range_and_a_miss_says_so() {
    let c = cache(1 << 20);
    let a = r(1, 10_000, 1);
    assert!(!hit(&c, &a));
    c.insert(&a, &bytes_of(&a));
    assert!(hit(&c, &a));
    let mut out = Vec::new();
    assert!(c.get_range(&a, 100, 4200, &mut out));
    assert_eq!(out, bytes_of(&a)[100..4200]);
    assert!(c.get_range(&a, 10_000, 10_000, &mut out));
    assert!(out.is_empty());
    // The same offset with another length or checksum is another value.
    assert!(!hit(&c, &r(1, 10_000, 2)));
    assert!(!hit(&c, &r(1, 9_999, 1)));
    let stats = c.stats();
    assert_eq!((stats.hits, stats.misses, stats.entries), (3, 3, 1));
    assert_eq!(
        stats.bytes,
        charged_bytes(10_000) + SHARDS as u64 * SHARD_BASE_BYTES
    );
    c.check();
}

#[test]
fn no_capacity_holds_nothing_and_setting_it_to_zero_empties_the_cache() {
    let c = ValueCache::new();
    let a = r(1, 5000, 1);
    c.insert(&a, &bytes_of(&a));
    c.insert_written(&a, &bytes_of(&a));
    assert!(!hit(&c, &a));
    assert_eq!(c.stats(), CacheStats::default(), "nothing counted");
    c.set_capacity(8 << 20);
    c.insert(&a, &bytes_of(&a));
    assert!(hit(&c, &a));
    c.set_capacity(0);
    assert!(!hit(&c, &a));
    let stats = c.stats();
    assert_eq!(
        (stats.bytes, stats.entries, stats.capacity_bytes),
        (0, 0, 0)
    );
    c.check();
}

/// Random inserts (by readers and writers), reads, ranges, removes and capacity changes
/// against a model of each offset's current value: a hit always returns the current
/// value's bytes, and after every step every shard is within its room, its counts agree
/// with its entries, and its map and queues take no more memory than they are charged.
#[test]
fn random_operations_stay_within_the_capacity_and_hit_only_current_values() {
    let seed = std::env::var("BFDB_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("cache random operations: seed {seed} (replay with BFDB_SEED={seed})");
    let mut x = seed | 1;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let c = cache(256 << 10);
    // The current value of each block: (len, version); a version bumps on a reuse.
    let mut current: Vec<(u32, u32)> = (0..400).map(|_| (0, 0)).collect();
    let mut hits = 0;
    for step in 0..30_000 {
        let block = next(current.len() as u64);
        let (len, version) = &mut current[block as usize];
        match next(100) {
            0..=29 => {
                // A reuse: the old value's entry goes first (the store's release), then
                // the writer's value.
                c.remove(block * 4096);
                *version += 1;
                *len = match next(10) {
                    0..=6 => 2049 + next(14_000) as u32,
                    7 | 8 => next(70_000) as u32,
                    _ => next(200_000) as u32,
                };
                let v = r(block, *len, *version);
                c.insert_written(&v, &bytes_of(&v));
            }
            30..=69 => {
                let v = r(block, *len, *version);
                if !hit(&c, &v) {
                    c.insert(&v, &bytes_of(&v));
                } else {
                    hits += 1;
                }
            }
            70..=84 => {
                let v = r(block, *len, *version);
                let from = next(u64::from(v.len) + 1) as usize;
                let to = from + next((v.len as usize - from) as u64 + 1) as usize;
                let mut out = Vec::new();
                if c.get_range(&v, from, to, &mut out) {
                    assert_eq!(out, bytes_of(&v)[from..to]);
                }
            }
            85..=89 => {
                // A stale reference (an older version) never hits.
                let old = r(block, *len, version.wrapping_sub(1));
                let mut out = Vec::new();
                assert!(!c.get(&old, &mut out), "a stale value hit");
            }
            90..=97 => c.remove(block * 4096),
            _ => {
                let shard = [0, 64 << 10, 200 << 10, 256 << 10, 1 << 20][next(5) as usize];
                c.set_capacity(shard * SHARDS as u64);
            }
        }
        if step % 7 == 0 {
            c.check();
        }
        let stats = c.stats();
        assert!(
            stats.bytes <= stats.capacity_bytes,
            "step {step}: {stats:?}"
        );
    }
    c.check();
    assert!(hits > 1000, "only {hits} hits: the test exercised little");
}

/// A hot set read again and again stays cached while ten times the capacity of values
/// read once each passes through: those go through the small queue only.
#[test]
fn values_read_once_pass_through_without_evicting_values_read_often() {
    let shard = 1 << 20;
    let c = cache(shard);
    let blocks = blocks_in_shard(0, 1300);
    let (hot, cold) = blocks.split_at(40);
    // 40 hot values of 8 KiB: about a third of the shard.
    let hot: Vec<ValueRef> = hot.iter().map(|&b| r(b, 8192, 1)).collect();
    for round in 0..3 {
        for v in &hot {
            if !hit(&c, v) {
                assert!(round < 2, "a hot value missed in round {round}");
                c.insert(v, &bytes_of(v));
            }
        }
    }
    // 1260 values of 8 KiB read once: ten times the shard.
    for &b in cold {
        let v = r(b, 8192, 1);
        assert!(!hit(&c, &v));
        c.insert(&v, &bytes_of(&v));
        c.check();
    }
    let missed = hot.iter().filter(|v| !hit(&c, v)).count();
    assert_eq!(missed, 0, "the scan evicted hot values");
    let stats = c.stats();
    assert!(stats.bytes <= stats.capacity_bytes);
}

/// A value that leaves the small queue unread is remembered: read again soon, it goes
/// to the main queue, where a later stream of values read once does not reach it.
#[test]
fn a_value_evicted_unread_goes_to_the_main_queue_on_its_next_miss() {
    let shard = 512 << 10;
    let c = cache(shard);
    let blocks = blocks_in_shard(3, 400);
    let first = r(blocks[0], 8192, 1);
    c.insert(&first, &bytes_of(&first));
    // Enough values read once to push it out of the small queue.
    for &b in &blocks[1..100] {
        let v = r(b, 8192, 1);
        c.insert(&v, &bytes_of(&v));
    }
    assert!(!hit(&c, &first), "evicted from the small queue");
    c.insert(&first, &bytes_of(&first));
    // Now in the main queue: a stream of twice the shard does not evict it while the
    // main queue holds only it.
    for &b in &blocks[100..230] {
        let v = r(b, 8192, 1);
        c.insert(&v, &bytes_of(&v));
    }
    assert!(
        hit(&c, &first),
        "a ghost's second miss goes to the main queue"
    );
    c.check();
}

#[test]
fn values_above_a_quarter_of_a_shard_are_never_cached_and_a_lower_capacity_drops_them() {
    let shard = 256 << 10;
    let c = cache(shard);
    let largest = (0..shard)
        .rev()
        .find(|&len| charged_bytes(len) <= shard / 4)
        .unwrap() as u32;
    let fits = r(1, largest, 1);
    let too_large = r(2, largest + 1, 1);
    for v in [&fits, &too_large] {
        c.insert_written(v, &bytes_of(v));
    }
    assert!(hit(&c, &fits));
    assert!(!hit(&c, &too_large));
    let misses = c.stats().misses;
    assert!(!hit(&c, &too_large));
    assert_eq!(
        c.stats().misses,
        misses,
        "a value too large counts as no miss"
    );
    // Half the capacity: the entry is now too large, and goes at once.
    c.set_capacity(shard / 2 * SHARDS as u64);
    assert!(!c.holds(fits.offset));
    c.check();
}

#[test]
fn a_removed_entry_is_gone_and_the_value_written_next_at_its_offset_is_cached() {
    let c = cache(1 << 20);
    let old = r(5, 6000, 1);
    c.insert(&old, &bytes_of(&old));
    c.remove(old.offset);
    assert!(!c.holds(old.offset));
    assert!(!hit(&c, &old));
    // The extent reused by a value of the same length and checksum but other bytes
    // (here: another version, as the test's bytes depend on it, with the same "crc").
    let new = r(5, 6000, 2);
    c.insert_written(&new, &bytes_of(&new));
    assert!(hit(&c, &new));
    // A reader's insert of the value already held keeps it.
    c.insert(&new, &bytes_of(&new));
    assert_eq!(c.stats().entries, 1);
    c.check();
}

/// The store must drop an extent's entry before the extent is written again; were one
/// left, the cache would serve its bytes for the new value of the same reference. In
/// builds with debug assertions the cache refuses to go on.
#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "an entry outlived its extent")]
fn a_written_value_that_meets_an_entry_left_at_its_offset_is_a_bug() {
    let c = cache(1 << 20);
    let old = r(5, 6000, 1);
    c.insert(&old, &bytes_of(&old));
    c.insert_written(&old, &[0; 6000]);
}
