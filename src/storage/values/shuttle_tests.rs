//! Shuttle explores thread interleavings of the value store's reader guards and
//! releases (run with `cargo test --features shuttle --lib storage::values`): under the
//! `shuttle` feature the era, the readers' counters, the store's lock and the memory
//! device's lock are shuttle's, so each is a scheduling point.
//!
//! A failing random schedule prints its seed; `SHUTTLE_RANDOM_SEED=<seed>` with
//! `BFDB_SHUTTLE_ITERATIONS=1` replays it. Iterations: `BFDB_SHUTTLE_ITERATIONS`
//! (default 300 per test; PCT runs the same number).

use super::*;
use crate::storage::MemBlocks;
use crate::sync::thread;

fn iterations() -> usize {
    std::env::var("BFDB_SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// Runs `f` under shuttle's random scheduler and under PCT of depth 4: the schedules
/// that matter park a reader across a whole release (three preemptions and a start).
fn explore(f: impl Fn() + Send + Sync + 'static) {
    let f = Arc::new(f);
    let g = f.clone();
    shuttle::check_random(move || f(), iterations());
    shuttle::check_pct(move || g(), iterations(), 4);
}

/// Two readers look a key up twice each in an "index" (a mutex holding the key's
/// reference and the byte its value repeats) under a fresh guard each time and read
/// the value they find, while a writer twice replaces the key's value: it deletes the
/// key, frees the extent, releases it, and writes the next value, which takes the
/// freed space once the release is done. A reader never reads bytes of another value
/// (they would fail the checksum or the comparison), whatever era it registered in,
/// and the releases and writes all finish.
#[test]
fn readers_that_found_a_reference_read_its_value_while_its_space_is_reused() {
    explore(|| {
        let store = Arc::new(ValueStore::open(Arc::new(MemBlocks::new()), 1));
        let r = store.write(&[1u8; 3000]).unwrap();
        store.applied(r, 0, b"k");
        let index = Arc::new(crate::sync::Mutex::new(Some((r, 1u8))));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (store, index) = (Arc::clone(&store), Arc::clone(&index));
                thread::spawn(move || {
                    for _ in 0..2 {
                        let _guard = store.read_guard();
                        let found = *index.lock();
                        if let Some((r, byte)) = found {
                            let mut out = Vec::new();
                            store.read(&r, &mut out).unwrap();
                            assert!(out.iter().all(|&b| b == byte));
                        }
                    }
                })
            })
            .collect();
        let mut current = r;
        for byte in [2u8, 3] {
            *index.lock() = None;
            store.free(current, 0, b"k");
            store.release(1).unwrap();
            // The freed extent is the only free space: the next value takes it.
            let next = store.write(&[byte; 3000]).unwrap();
            assert_eq!(next.offset, r.offset);
            store.applied(next, 0, b"k");
            *index.lock() = Some((next, byte));
            current = next;
        }
        for reader in readers {
            reader.join().unwrap();
        }
        store.check();
    });
}

/// The guard protocol alone, in few enough steps that PCT finds the schedules where a
/// reader stalls between reading the era and counting itself across a whole release:
/// two readers each publish-load an object's number under a guard and check the
/// object is still alive after a yield, while a writer twice swaps in a new object,
/// waits for earlier readers and retires the old one.
#[test]
fn a_guarded_reader_never_sees_what_it_found_retired() {
    use crate::sync::atomic::AtomicBool;
    explore(|| {
        let readers = Arc::new(Readers::default());
        let published = Arc::new(AtomicU64::new(0));
        let alive = Arc::new([
            AtomicBool::new(true),
            AtomicBool::new(true),
            AtomicBool::new(true),
        ]);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (readers, published, alive) = (
                    Arc::clone(&readers),
                    Arc::clone(&published),
                    Arc::clone(&alive),
                );
                thread::spawn(move || {
                    for _ in 0..2 {
                        let _guard = readers.enter();
                        let found = published.load(Ordering::SeqCst) as usize;
                        thread::yield_now();
                        assert!(
                            alive[found].load(Ordering::SeqCst),
                            "object {found} retired"
                        );
                    }
                })
            })
            .collect();
        for next in 1..3 {
            let old = published.swap(next, Ordering::SeqCst) as usize;
            readers.wait_for_earlier();
            alive[old].store(false, Ordering::SeqCst);
        }
        for t in threads {
            t.join().unwrap();
        }
    });
}

/// The test above with the value cache on, and every value written of the first one's
/// length and checksum (so of the same reference) but other bytes: readers that found
/// the reference before a free read and cache the old value while the writer frees and
/// releases the extent and writes the next value into it. The release drops the entry
/// only after those readers are gone, so no read returns the bytes of another version
/// than the one it found (without the release's drop, the old bytes would answer for
/// the new value, and the writer's insert stops a build with debug assertions).
#[test]
fn cached_reads_never_answer_a_reused_extent_with_the_old_bytes() {
    let first = vec![1u8; 3000];
    let crc = crc32c::crc32c(&first);
    let versions: Arc<Vec<Vec<u8>>> = Arc::new(
        std::iter::once(first)
            .chain((2..4u8).map(|b| with_crc(vec![b; 3000], crc)))
            .collect(),
    );
    explore(move || {
        let store = Arc::new(ValueStore::open(Arc::new(MemBlocks::new()), 1));
        store.cache().set_capacity(1 << 20);
        let r = store.write(&versions[0]).unwrap();
        store.applied(r, 0, b"k");
        let index = Arc::new(crate::sync::Mutex::new(Some(0usize)));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (store, index, versions) = (
                    Arc::clone(&store),
                    Arc::clone(&index),
                    Arc::clone(&versions),
                );
                thread::spawn(move || {
                    for _ in 0..2 {
                        let _guard = store.read_guard();
                        let found = *index.lock();
                        if let Some(version) = found {
                            let mut out = Vec::new();
                            store.read(&r, &mut out).unwrap();
                            assert!(out == versions[version], "read another version");
                        }
                    }
                })
            })
            .collect();
        for version in 1..3 {
            *index.lock() = None;
            store.free(r, 0, b"k");
            store.release(1).unwrap();
            let next = store.write(&versions[version]).unwrap();
            assert_eq!(next, r, "the same extent, length and checksum");
            store.applied(next, 0, b"k");
            *index.lock() = Some(version);
        }
        for reader in readers {
            reader.join().unwrap();
        }
        store.check();
        store.cache().check();
    });
}
