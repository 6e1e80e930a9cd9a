//! Unit tests of the value store: round trips of every size class over every device,
//! partial reads, damage, the allocator (against a model, with proptest), the
//! generation rule, readers, snapshots and IO errors.

use std::sync::mpsc;

use proptest::prelude::*;

use super::*;
use crate::storage::{MemBlocks, SimBlocks};

const BLOCK: u64 = IO_ALIGN_BYTES;

/// `len` bytes that differ from those of any other `tag`.
fn value(len: usize, tag: u64) -> Vec<u8> {
    let mut x = tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A store on memory blocks that gives freed space back at once (no slack kept).
fn mem() -> (Arc<MemBlocks>, ValueStore) {
    let device = Arc::new(MemBlocks::new());
    let store = ValueStore::open(device.clone(), 1).with_slack_floor(0);
    (device, store)
}

/// The extents (reference and state) by offset.
fn extents(store: &ValueStore) -> Vec<(ValueRef, Extent)> {
    let state = store.state.lock();
    state.extents.values().map(|e| (e.r, e.state)).collect()
}

/// The owner of every live extent, by offset.
fn owners(store: &ValueStore) -> Vec<(u64, u32)> {
    let state = store.state.lock();
    state
        .extents
        .values()
        .filter(|e| e.state == Extent::Live)
        .map(|e| (e.r.offset, e.owner))
        .collect()
}

fn state_of(store: &ValueStore, r: &ValueRef) -> Option<Extent> {
    store.state.lock().entry_of(r).map(|e| e.state)
}

fn free_ranges(store: &ValueStore) -> Vec<(u64, u64)> {
    let state = store.state.lock();
    state.free.by_start.iter().map(|(&s, &l)| (s, l)).collect()
}

fn read_all(store: &ValueStore, r: &ValueRef) -> Result<Vec<u8>> {
    let mut out = vec![0xAA; 3];
    let result = store.read(r, &mut out);
    if result.is_err() {
        assert!(out.is_empty(), "a failed read leaves nothing in out");
    }
    result.map(|()| out)
}

/// Writes `len` bytes tagged `tag` and applies them.
fn live(store: &ValueStore, len: usize, tag: u64) -> ValueRef {
    let r = store.write(&value(len, tag)).unwrap();
    store.applied(r, 0, &tag.to_le_bytes());
    r
}

/// A device that remembers the largest read and write it was asked for.
struct Largest {
    inner: MemBlocks,
    read_bytes: std::sync::atomic::AtomicUsize,
    write_bytes: std::sync::atomic::AtomicUsize,
}

impl BlockDevice for Largest {
    fn write(&self, address: u64, bytes: &[u8]) -> io::Result<()> {
        self.write_bytes
            .fetch_max(bytes.len(), std::sync::atomic::Ordering::Relaxed);
        self.inner.write(address, bytes)
    }
    fn read(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_bytes
            .fetch_max(buf.len(), std::sync::atomic::Ordering::Relaxed);
        self.inner.read(address, buf)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn truncate_before(&self, address: u64) -> io::Result<()> {
        self.inner.truncate_before(address)
    }
}

const SIZES: &[usize] = &[
    0,
    1,
    511,
    4095,
    4096,
    4097,
    10_000,
    65_535,
    65_536,
    65_537,
    3 * 65_536 + 17,
    1 << 20,
    (1 << 20) + 1,
    (3 << 20) + 12_345,
];

fn round_trips(device: Arc<dyn BlockDevice>, what: &str) {
    let store = ValueStore::open(device, 1);
    let written: Vec<(ValueRef, Vec<u8>)> = SIZES
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let v = value(len, i as u64);
            (store.write(&v).unwrap(), v)
        })
        .collect();
    for (r, v) in &written {
        assert_eq!(r.len as usize, v.len());
        assert!(r.offset.is_multiple_of(BLOCK));
        assert_eq!(
            read_all(&store, r).unwrap(),
            *v,
            "{what}: {} bytes",
            v.len()
        );
    }
    store.check();
}

#[test]
fn refs_are_16_little_endian_bytes_and_decode_only_whole_aligned_ones() {
    let r = ValueRef {
        offset: 3 * BLOCK,
        len: 0x0102_0304,
        crc: 0xA0B0_C0D0,
    };
    let bytes = r.encode();
    assert_eq!(&bytes[..8], &(3 * BLOCK).to_le_bytes());
    assert_eq!(&bytes[8..12], &[4, 3, 2, 1]);
    assert_eq!(&bytes[12..], &[0xD0, 0xC0, 0xB0, 0xA0]);
    assert_eq!(ValueRef::decode(&bytes), Some(r));
    assert_eq!(ValueRef::decode(&bytes[..15]), None);
    assert_eq!(ValueRef::decode(&[bytes.as_slice(), &[0]].concat()), None);
    let mut unaligned = bytes;
    unaligned[0] = 1;
    assert_eq!(ValueRef::decode(&unaligned), None);
}

#[test]
fn extents_hold_the_value_and_its_chunk_table_in_whole_blocks() {
    assert_eq!(extent_bytes(0), BLOCK);
    assert_eq!(extent_bytes(1), BLOCK);
    assert_eq!(extent_bytes(4096), BLOCK);
    assert_eq!(extent_bytes(4097), 2 * BLOCK);
    assert_eq!(extent_bytes(65_536), 16 * BLOCK);
    // Two chunks: 8 table bytes spill into a 17th block.
    assert_eq!(extent_bytes(65_537), 17 * BLOCK);
    assert_eq!(
        extent_bytes(u32::MAX),
        (u32::MAX as u64 + 4 * 65_536).next_multiple_of(BLOCK)
    );
    assert!(chunk_table(&[0; 65_536]).is_empty());
    let big = value(65_536 * 2 + 5, 9);
    let table = chunk_table(&big);
    assert_eq!(table.len(), 12);
    assert_eq!(&table[8..], &crc32c::crc32c(&big[131_072..]).to_le_bytes());
}

#[test]
fn values_of_every_size_round_trip_on_every_device() {
    round_trips(Arc::new(MemBlocks::new()), "memory, sector reads");
    // Segments of 36 KiB: every chunk and most IO pieces straddle a boundary.
    round_trips(
        Arc::new(MemBlocks::with_segments(9 * BLOCK)),
        "memory segments",
    );
    round_trips(Arc::new(SimBlocks::new(7)), "simulated, block reads");
    let dir = tempfile::tempdir().unwrap();
    for direct in [false, true] {
        let files = SegmentFiles::new(
            dir.path(),
            (&format!("v{direct}"), "vlog"),
            40 * BLOCK,
            direct,
        );
        round_trips(Arc::new(files), &format!("segment files, direct {direct}"));
    }
}

#[test]
fn io_goes_in_pieces_of_at_most_a_mebibyte() {
    let device = Arc::new(Largest {
        inner: MemBlocks::new(),
        read_bytes: 0.into(),
        write_bytes: 0.into(),
    });
    let store = ValueStore::open(device.clone(), 1);
    let v = value((5 << 20) + 3, 1);
    let r = store.write(&v).unwrap();
    assert_eq!(read_all(&store, &r).unwrap(), v);
    let largest = |a: &std::sync::atomic::AtomicUsize| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(largest(&device.write_bytes), IO_PIECE_BYTES as usize);
    assert_eq!(largest(&device.read_bytes), IO_PIECE_BYTES as usize);
}

#[test]
fn read_range_returns_any_part_across_chunk_and_segment_boundaries() {
    let seed = 0x5eed_u64;
    eprintln!("read_range seed {seed}");
    for device in [
        Arc::new(MemBlocks::new()),
        Arc::new(MemBlocks::with_segments(9 * BLOCK)),
    ] {
        let store = ValueStore::open(device, 1);
        for (tag, len) in [(1, 4 * 65_536 + 777), (2, 3000), (3, 65_536), (4, 65_537)] {
            let v = value(len, tag);
            let r = store.write(&v).unwrap();
            let c = CHUNK_BYTES as usize;
            let mut ranges = vec![(0, 1), (0, len), (len - 1, 1), (len / 2, len - len / 2)];
            if len > c {
                ranges.extend([(c - 5, 10), (c, c), (c - 1, 2 * c.min(len - c) - 1)]);
            }
            ranges.retain(|&(at, n)| at + n <= len);
            let mut x = seed ^ tag;
            for _ in 0..40 {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let at = (x >> 33) as usize % len;
                let n = (x >> 7) as usize % (len - at + 1);
                ranges.push((at, n));
            }
            let mut out = Vec::new();
            for (at, n) in ranges {
                store.read_range(&r, at as u64, n, &mut out).unwrap();
                assert_eq!(out, &v[at..at + n], "{len}-byte value, {n} bytes at {at}");
            }
            // Past the end: an error, nothing returned.
            for (at, n) in [(len, 1), (0, len + 1), (u64::MAX as usize, 2)] {
                let e = store.read_range(&r, at as u64, n, &mut out).unwrap_err();
                assert!(
                    matches!(&e, Error::Io(io) if io.kind() == io::ErrorKind::InvalidInput),
                    "{e:?}"
                );
                assert!(out.is_empty());
            }
            // The empty range at the very end is fine.
            store.read_range(&r, len as u64, 0, &mut out).unwrap();
            assert!(out.is_empty());
        }
    }
}

#[test]
fn read_range_of_a_big_value_reads_its_table_and_the_chunks_asked_only() {
    let (device, store) = mem();
    let v = value(4 << 20, 5);
    let r = store.write(&v).unwrap();
    let mut out = Vec::new();
    let c = CHUNK_BYTES;
    for (at, n, chunks) in [
        (3 * c + 100, 10, 1),
        (7 * c - 3, 6, 2),
        (0, 1, 1),
        ((4 << 20) - 1, 1, 1),
    ] {
        let before = device.io_bytes().1;
        store.read_range(&r, at, n, &mut out).unwrap();
        assert_eq!(out, &v[at as usize..at as usize + n]);
        let read = device.io_bytes().1 - before;
        // The 256-byte table, in a sector or two, and the chunks.
        assert!(
            read >= chunks * c && read <= chunks * c + 1024,
            "{read} bytes read for {n} at {at}"
        );
    }
}

#[test]
fn a_flipped_bit_in_a_value_or_its_table_is_corrupt_file_naming_file_and_address() {
    let device = Arc::new(MemBlocks::with_segments(64 * BLOCK));
    let store = ValueStore::open(device.clone(), 1);
    let _pad = store.write(&value(70 * 4096, 0)).unwrap();
    let small = value(3000, 1);
    let s = store.write(&small).unwrap();
    let big = value(5 * 65_536 + 9, 2);
    let b = store.write(&big).unwrap();
    let expect_corrupt = |e: Error, address: u64, what: &str| match e {
        Error::CorruptFile { path, reason } => {
            let segment = address / (64 * BLOCK);
            assert_eq!(
                path,
                PathBuf::from(format!("mem-{segment:08x}")),
                "{reason}"
            );
            assert!(reason.contains("value extent"), "{reason}");
            assert!(reason.contains(&format!("address {address}")), "{reason}");
            assert!(reason.contains(what), "{reason}");
        }
        other => panic!("expected CorruptFile, got {other:?}"),
    };
    let mut out = Vec::new();
    // In the small value: any read of it fails.
    assert!(device.flip_bit(s.offset + 2999, 3));
    expect_corrupt(read_all(&store, &s).unwrap_err(), s.offset, "checksum");
    expect_corrupt(
        store.read_range(&s, 0, 10, &mut out).unwrap_err(),
        s.offset,
        "checksum",
    );
    assert!(out.is_empty());
    assert!(device.flip_bit(s.offset + 2999, 3));
    assert_eq!(read_all(&store, &s).unwrap(), small);
    // In chunk 2 of the big value: whole reads and reads touching it fail, reads of
    // other chunks do not.
    let chunk2 = b.offset + 2 * CHUNK_BYTES;
    assert!(device.flip_bit(chunk2 + 1234, 0));
    expect_corrupt(read_all(&store, &b).unwrap_err(), chunk2, "chunk 2");
    expect_corrupt(
        store
            .read_range(&b, 2 * CHUNK_BYTES - 1, 2, &mut out)
            .unwrap_err(),
        chunk2,
        "chunk 2",
    );
    store.read_range(&b, CHUNK_BYTES, 100, &mut out).unwrap();
    assert_eq!(out, &big[65_536..65_636]);
    assert!(device.flip_bit(chunk2 + 1234, 0));
    // In the table: every read of the big value fails.
    let table = b.offset + big.len() as u64 + 5;
    assert!(device.flip_bit(table, 7));
    expect_corrupt(
        read_all(&store, &b).unwrap_err(),
        b.offset + big.len() as u64,
        "chunk table",
    );
    expect_corrupt(
        store.read_range(&b, 0, 1, &mut out).unwrap_err(),
        b.offset + big.len() as u64,
        "chunk table",
    );
    assert!(device.flip_bit(table, 7));
    assert_eq!(read_all(&store, &b).unwrap(), big);
}

#[test]
fn freed_space_is_reused_only_after_release() {
    let (device, store) = mem();
    let a = live(&store, 8000, 1);
    let _b = live(&store, 8000, 2);
    store.free(a, 0, b"a");
    assert_eq!(state_of(&store, &a), Some(Extent::Deferred { free_gen: 1 }));
    assert_eq!(store.stats().deferred_bytes, 2 * BLOCK);
    // Deferred: a write of the same size goes elsewhere, and `a` still reads.
    let c = live(&store, 8000, 3);
    assert_ne!(c.offset, a.offset);
    assert_eq!(read_all(&store, &a).unwrap(), value(8000, 1));
    store.release(0).unwrap();
    assert_eq!(state_of(&store, &a), Some(Extent::Deferred { free_gen: 1 }));
    store.release(1).unwrap();
    assert_eq!(state_of(&store, &a), None);
    assert_eq!(free_ranges(&store), [(a.offset, 2 * BLOCK)]);
    // Its blocks went back to the device; the next write of its size takes its place.
    assert_eq!(device.block_count(), 4);
    let d = live(&store, 7000, 4);
    assert_eq!(d.offset, a.offset);
    assert!(free_ranges(&store).is_empty());
    store.check();
}

#[test]
fn freed_neighbours_coalesce_and_a_freed_top_lowers_the_end() {
    let (device, store) = mem();
    let refs: Vec<ValueRef> = (0..5).map(|i| live(&store, 4096, i)).collect();
    assert_eq!(store.stats().end_bytes, 5 * BLOCK);
    for r in &refs[1..3] {
        store.free(*r, 0, b"k");
    }
    store.release(1).unwrap();
    assert_eq!(free_ranges(&store), [(BLOCK, 2 * BLOCK)]);
    // One value of two blocks fits the merged range exactly.
    let two = live(&store, 5000, 9);
    assert_eq!(two.offset, BLOCK);
    // The top two freed: the end comes down to the last live extent, and the device
    // drops what was above it.
    store.free(refs[3], 0, b"k");
    store.free(refs[4], 0, b"k");
    store.release(1).unwrap();
    assert_eq!(store.stats().end_bytes, 3 * BLOCK);
    assert!(free_ranges(&store).is_empty());
    assert_eq!(device.block_count(), 3);
    // Everything freed: nothing left.
    store.free(refs[0], 0, b"k");
    store.free(two, 0, b"k");
    store.release(1).unwrap();
    let stats = store.stats();
    assert_eq!(
        (stats.end_bytes, stats.allocated_bytes, stats.free_bytes),
        (0, 0, 0)
    );
    assert_eq!(device.block_count(), 0);
    store.check();
}

#[test]
fn allocation_takes_the_best_fitting_free_range() {
    let (_device, store) = mem();
    // Holes of 3, 1 and 2 blocks between live extents of 1 block.
    let mut holes = Vec::new();
    for (i, blocks) in [3u64, 1, 2].into_iter().enumerate() {
        live(&store, 10, 100 + i as u64);
        holes.push(live(&store, (blocks * BLOCK) as usize, i as u64));
    }
    live(&store, 10, 200);
    for r in &holes {
        store.free(*r, 0, b"k");
    }
    store.release(1).unwrap();
    assert_eq!(free_ranges(&store).len(), 3);
    let two = store.write(&value(2 * BLOCK as usize, 7)).unwrap();
    assert_eq!(two.offset, holes[2].offset);
    let one = store.write(&value(100, 8)).unwrap();
    assert_eq!(one.offset, holes[1].offset);
    // Nothing of 4 blocks fits: the end grows.
    let end = store.stats().end_bytes;
    let four = store.write(&value(4 * BLOCK as usize, 9)).unwrap();
    assert_eq!(four.offset, end);
    store.check();
}

#[test]
fn a_free_of_another_reference_than_the_extents_own_changes_nothing() {
    let (_device, store) = mem();
    let a = live(&store, 5000, 1);
    for other in [
        ValueRef { len: 5001, ..a },
        ValueRef {
            crc: a.crc ^ 1,
            ..a
        },
        ValueRef {
            offset: a.offset + BLOCK,
            ..a
        },
    ] {
        store.free(other, 0, b"k");
        assert_eq!(state_of(&store, &a), Some(Extent::Live));
    }
    store.free(a, 0, b"k");
    // A second free, after the window moved the generation, keeps the first one's.
    store.open_window(5);
    store.free(a, 0, b"k");
    assert_eq!(state_of(&store, &a), Some(Extent::Deferred { free_gen: 1 }));
    store.release(1).unwrap();
    // Reused by another value: a late free of the old reference does not free it.
    let b = live(&store, 6000, 2);
    assert_eq!(b.offset, a.offset);
    store.free(a, 0, b"k");
    assert_eq!(state_of(&store, &b), Some(Extent::Live));
    store.check();
}

#[test]
fn abort_and_a_failed_write_free_the_extent_at_once() {
    let (device, store) = mem();
    let keep = live(&store, 100, 1);
    let gone = store.write(&value(9000, 2)).unwrap();
    store.abort(gone);
    assert_eq!(state_of(&store, &gone), None);
    assert_eq!(store.stats().end_bytes, BLOCK);
    // Abort of a live extent is ignored.
    store.abort(keep);
    assert_eq!(state_of(&store, &keep), Some(Extent::Live));
    device.fail_writes();
    let e = store.write(&value(70_000, 3)).unwrap_err();
    assert!(
        matches!(&e, Error::Io(io) if io.to_string().contains("EIO")),
        "{e:?}"
    );
    let stats = store.stats();
    assert_eq!(
        (stats.end_bytes, stats.allocated_bytes, stats.pending_bytes),
        (BLOCK, BLOCK, 0)
    );
    store.check();
}

#[test]
fn a_failed_write_names_the_segment_file() {
    let dir = tempfile::tempdir().unwrap();
    // A directory where the segment file should be: opening it for writing fails.
    std::fs::create_dir(dir.path().join("values-00000000.vlog")).unwrap();
    let store = ValueStore::open(Arc::new(value_files(dir.path(), false)), 1);
    let e = store.write(&value(5000, 1)).unwrap_err();
    assert!(e.to_string().contains("values-00000000.vlog"), "{e}");
    assert_eq!(store.stats().allocated_bytes, 0);
}

#[test]
fn a_failed_read_is_an_error_with_nothing_returned() {
    let (device, store) = mem();
    let r = live(&store, 200_000, 1);
    device.fail_reads(1);
    assert!(read_all(&store, &r).is_err());
    assert_eq!(read_all(&store, &r).unwrap(), value(200_000, 1));
}

#[test]
fn mark_live_takes_its_range_out_of_free_space_and_drops_freed_overlaps() {
    let (_device, store) = mem();
    let refs: Vec<ValueRef> = (0..5).map(|i| live(&store, 4096, i)).collect();
    for r in &refs[1..4] {
        store.free(*r, 0, b"k");
    }
    store.release(1).unwrap();
    assert_eq!(free_ranges(&store), [(BLOCK, 3 * BLOCK)]);
    // A replayed reference in the middle of the free range splits it.
    let middle = ValueRef {
        offset: 2 * BLOCK,
        len: 100,
        crc: 7,
    };
    store.mark_live(middle, 0).unwrap();
    assert_eq!(free_ranges(&store), [(BLOCK, BLOCK), (3 * BLOCK, BLOCK)]);
    store.check();
    // Above the end: the end grows over it, the gap is free.
    let end = store.stats().end_bytes;
    let above = ValueRef {
        offset: end + 2 * BLOCK,
        len: 5000,
        crc: 8,
    };
    store.mark_live(above, 0).unwrap();
    assert_eq!(store.stats().end_bytes, end + 4 * BLOCK);
    assert_eq!(free_ranges(&store).last(), Some(&(end, 2 * BLOCK)));
    store.check();
    // Over a deferred extent (released and reused before a crash): the deferred one
    // goes, and its part outside the new extent is free.
    store.free(refs[4], 0, b"k");
    let over = ValueRef {
        offset: 4 * BLOCK,
        len: 10,
        crc: 9,
    };
    store.mark_live(over, 0).unwrap();
    assert_eq!(state_of(&store, &refs[4]), None);
    assert_eq!(state_of(&store, &over), Some(Extent::Live));
    store.check();
    // Over a live extent of another reference: an error, and nothing changes.
    let before = extents(&store);
    let clash = ValueRef {
        offset: refs[0].offset,
        len: 9000,
        crc: 1,
    };
    let e = store.mark_live(clash, 0).unwrap_err();
    assert!(
        matches!(&e, Error::CorruptFile { reason, .. } if reason.contains("overlaps")),
        "{e:?}"
    );
    assert_eq!(extents(&store), before);
    // Any state of its own reference becomes live; so does `applied` of one unknown.
    store.free(refs[0], 0, b"k");
    store.mark_live(refs[0], 0).unwrap();
    assert_eq!(state_of(&store, &refs[0]), Some(Extent::Live));
    let unknown = ValueRef {
        offset: BLOCK,
        len: 1,
        crc: 2,
    };
    store.applied(unknown, 0, b"k");
    assert_eq!(state_of(&store, &unknown), Some(Extent::Live));
    store.check();
}

#[test]
fn frees_are_for_the_next_checkpoint_and_those_in_a_window_are_uncertain() {
    let store = ValueStore::open(Arc::new(MemBlocks::new()), 5);
    let [a, b, c, d, e] = [1, 2, 3, 4, 5].map(|i| live(&store, 3000, i));
    store.free(a, 1, b"a");
    assert_eq!(state_of(&store, &a), Some(Extent::Deferred { free_gen: 5 }));
    store.open_window(7);
    store.free(b, 1, b"b");
    store.applied(e, 2, b"e"); // already live: noted in the window all the same
    let f = store.write(&value(3000, 6)).unwrap();
    store.applied(f, 2, b"f");
    let g = store.write(&value(3000, 7)).unwrap(); // pending at the snapshot
    assert_eq!(state_of(&store, &b), Some(Extent::Deferred { free_gen: 8 }));
    let snapshot = store.snapshot();
    store.free(c, 1, b"c");
    assert_eq!(state_of(&store, &c), Some(Extent::Deferred { free_gen: 8 }));
    let (restored, mut uncertain) =
        ValueStore::restore(Arc::new(MemBlocks::new()), Path::new("ckpt"), &snapshot).unwrap();
    uncertain.sort_by_key(|u| u.r.offset);
    let expect = |r: ValueRef, keyspace, key: &[u8], freed| Uncertain {
        r,
        keyspace,
        key: key.to_vec(),
        freed,
    };
    assert_eq!(
        uncertain,
        [
            expect(b, 1, b"b", true),
            expect(e, 2, b"e", false),
            expect(f, 2, b"f", false)
        ]
    );
    // Pending extents are not in the snapshot; everything else is.
    assert_eq!(state_of(&restored, &g), None);
    assert_eq!(state_of(&restored, &d), Some(Extent::Live));
    assert_eq!(
        state_of(&restored, &a),
        Some(Extent::Deferred { free_gen: 5 })
    );
    assert_eq!(restored.state.lock().next_gen, 8);
    // The window is closed: the next snapshot has nothing uncertain.
    let (_, none) = ValueStore::restore(
        Arc::new(MemBlocks::new()),
        Path::new("ckpt"),
        &store.snapshot(),
    )
    .unwrap();
    assert!(none.is_empty());
    // Release frees exactly the extents freed for the oldest kept checkpoint or before.
    store.release(7).unwrap();
    assert_eq!(state_of(&store, &a), None);
    assert_eq!(state_of(&store, &b), Some(Extent::Deferred { free_gen: 8 }));
    store.release(8).unwrap();
    assert_eq!((state_of(&store, &b), state_of(&store, &c)), (None, None));
    store.check();
}

/// A dropped keyspace's live extents are freed as any free is (deferred for the next
/// checkpoint, then released); other keyspaces' extents, pending ones and those already
/// freed stay as they are. Owners survive a snapshot, so a restored store frees the
/// same extents for a keyspace its database no longer names.
#[test]
fn dropping_a_keyspace_frees_exactly_the_live_extents_it_owns() {
    let store = ValueStore::open(Arc::new(MemBlocks::new()), 4).with_slack_floor(0);
    let live_in = |keyspace: u32, len: usize, tag: u64| {
        let r = store.write(&value(len, tag)).unwrap();
        store.applied(r, keyspace, b"k");
        r
    };
    let mine = [live_in(1, 3000, 1), live_in(1, 70_000, 2)];
    let theirs = live_in(2, 5000, 3);
    let pending = store.write(&value(4000, 4)).unwrap();
    let freed = live_in(1, 6000, 5);
    store.free(freed, 1, b"k");
    let (restored, _) = ValueStore::restore(
        Arc::new(MemBlocks::new()),
        Path::new("c"),
        &store.snapshot(),
    )
    .unwrap();
    assert_eq!(owners(&restored), owners(&store));
    assert_eq!(
        owners(&store),
        [(mine[0].offset, 1), (mine[1].offset, 1), (theirs.offset, 2)]
    );
    let live_before = store.stats().live_bytes;
    assert_eq!(store.drop_keyspaces(|k| k == 1), 73_000);
    assert_eq!(store.stats().live_bytes, live_before - 73_000);
    for r in &mine {
        assert_eq!(state_of(&store, r), Some(Extent::Deferred { free_gen: 4 }));
    }
    assert_eq!(state_of(&store, &theirs), Some(Extent::Live));
    assert_eq!(state_of(&store, &pending), Some(Extent::Pending));
    assert_eq!(
        state_of(&store, &freed),
        Some(Extent::Deferred { free_gen: 4 })
    );
    assert_eq!(
        store.drop_keyspaces(|k| k == 1),
        0,
        "nothing is freed twice"
    );
    store.release(4).unwrap();
    assert_eq!(store.stats().deferred_bytes, 0);
    assert_eq!(state_of(&store, &mine[1]), None);
    store.check();
    // Recovery from the snapshot taken before the drop, with keyspace 1 gone.
    assert_eq!(restored.drop_keyspaces(|k| k != 2), 73_000);
    assert_eq!(owners(&restored), [(theirs.offset, 2)]);
    restored.check();
}

#[test]
fn a_reader_keeps_a_freed_extent_from_reuse_until_it_is_done() {
    let (_device, store) = mem();
    let store = Arc::new(store);
    let a = live(&store, 5000, 1);
    let v = value(5000, 1);
    // The reader found `a` in the index before it was freed.
    let reader = store.read_guard();
    store.free(a, 0, b"a");
    let (done_tx, done_rx) = mpsc::channel();
    let releaser = {
        let store = Arc::clone(&store);
        crate::sync::thread::spawn(move || {
            store.release(1).unwrap();
            done_tx.send(()).unwrap();
        })
    };
    while state_of(&store, &a) == Some(Extent::Deferred { free_gen: 1 }) {
        crate::sync::thread::yield_now();
    }
    // In grace: not handed out, still readable, and the release has not finished.
    let b = store.write(&v).unwrap();
    assert_ne!(b.offset, a.offset);
    assert_eq!(read_all(&store, &a).unwrap(), v);
    assert!(done_rx.try_recv().is_err());
    assert_eq!(state_of(&store, &a), Some(Extent::Grace { free_gen: 1 }));
    // A reader that starts after the free does not hold the release up.
    let later = store.read_guard();
    drop(reader);
    done_rx.recv().unwrap();
    releaser.join().unwrap();
    assert_eq!(state_of(&store, &a), None);
    drop(later);
    // Guards cross threads.
    let guard = store.read_guard();
    crate::sync::thread::spawn(move || drop(guard))
        .join()
        .unwrap();
    store.release(1).unwrap();
    store.check();
}

#[test]
fn a_snapshot_restores_the_same_state_and_damaged_ones_are_errors() {
    let (device, store) = mem();
    let refs: Vec<ValueRef> = (0..12)
        .map(|i| live(&store, 3000 + 70_000 * (i % 3), i as u64))
        .collect();
    for r in refs.iter().step_by(3) {
        store.free(*r, 0, b"k");
    }
    store.release(1).unwrap();
    store.free(refs[1], 0, b"k");
    store.open_window(3);
    store.free(refs[2], 4, b"two");
    let bytes = store.snapshot();
    let (restored, uncertain) =
        ValueStore::restore(device.clone(), Path::new("ckpt-1"), &bytes).unwrap();
    restored.check();
    assert_eq!(extents(&restored), extents(&store));
    assert_eq!(free_ranges(&restored), free_ranges(&store));
    assert_eq!(restored.stats(), store.stats());
    assert_eq!(uncertain.len(), 1);
    for r in refs
        .iter()
        .filter(|r| state_of(&restored, r) == Some(Extent::Live))
    {
        assert_eq!(
            read_all(&restored, r).unwrap(),
            value(
                r.len as usize,
                refs.iter().position(|x| x == r).unwrap() as u64
            )
        );
    }
    // Every cut and every flipped bit is an error naming the file, never a panic.
    for cut in 0..bytes.len() {
        let e =
            ValueStore::restore(device.clone(), Path::new("ckpt-1"), &bytes[..cut]).unwrap_err();
        assert!(
            matches!(&e, Error::CorruptFile { path, .. } if path == Path::new("ckpt-1")),
            "{e:?}"
        );
    }
    for bit in 0..bytes.len() * 8 {
        let mut damaged = bytes.clone();
        damaged[bit / 8] ^= 1 << (bit % 8);
        assert!(
            ValueStore::restore(device.clone(), Path::new("c"), &damaged).is_err(),
            "bit {bit}"
        );
    }
}

/// `body` with its checksum appended.
fn sealed(body: &[u8]) -> Vec<u8> {
    let crc = crc32c::crc32c(body);
    [body, &crc.to_le_bytes()].concat()
}

#[test]
fn snapshots_with_a_valid_checksum_but_bad_contents_are_refused() {
    let header = |version: u32, end: u64, count: u64| {
        let mut b = b"BFVALUES".to_vec();
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&9u64.to_le_bytes());
        b.extend_from_slice(&end.to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
        b
    };
    let extent = |offset: u64, len: u32, state: u8| {
        let mut b = ValueRef {
            offset,
            len,
            crc: 0,
        }
        .encode()
        .to_vec();
        b.push(state);
        b
    };
    let restore = |body: Vec<u8>| {
        ValueStore::restore(Arc::new(MemBlocks::new()), Path::new("c"), &sealed(&body))
    };
    let reason = |body: Vec<u8>| match restore(body) {
        Err(Error::CorruptFile { reason, .. }) => reason,
        other => panic!("expected CorruptFile, got {other:?}"),
    };
    let ok = [
        header(1, 2 * BLOCK, 2),
        extent(0, 10, 1),
        extent(BLOCK, 10, 1),
    ]
    .concat();
    let (store, _) = restore(ok).unwrap();
    assert_eq!(store.state.lock().next_gen, 9);
    // Version 1 has no owners; version 2 gives each live extent's as a varint.
    assert_eq!(owners(&store), [(0, NO_OWNER), (BLOCK, NO_OWNER)]);
    let owned = [header(2, 2 * BLOCK, 2), extent(0, 10, 1), vec![5]].concat();
    let owned = [owned, extent(BLOCK, 10, 1), vec![0x80, 0x01]].concat();
    let (store, _) = restore(owned).unwrap();
    assert_eq!(owners(&store), [(0, 5), (BLOCK, 128)]);
    let too_big = [
        header(2, BLOCK, 1),
        extent(0, 10, 1),
        vec![0x80; 4],
        vec![0x10],
    ]
    .concat();
    assert!(reason(too_big).contains("bad owner"));
    assert!(reason([header(2, BLOCK, 1), extent(0, 10, 1)].concat()).contains("bad owner"));
    assert!(matches!(
        restore(header(3, 0, 0)),
        Err(Error::Incompatible { .. })
    ));
    let mut magic = header(1, 0, 0);
    magic[0] = b'X';
    assert!(reason(magic).contains("magic"));
    assert!(reason(header(1, 100, 0)).contains("aligned"));
    assert!(reason([header(1, BLOCK, 1), extent(0, 5000, 1)].concat()).contains("past the end"));
    let overlap = [
        header(1, 4 * BLOCK, 2),
        extent(0, 5000, 1),
        extent(BLOCK, 1, 1),
    ]
    .concat();
    assert!(reason(overlap).contains("overlaps"));
    assert!(reason([header(1, BLOCK, 1), extent(0, 1, 3)].concat()).contains("unknown state"));
    assert!(reason([header(1, BLOCK, 2), extent(0, 1, 1)].concat()).contains("truncated"));
    assert!(reason([header(1, BLOCK, 1), extent(0, 1, 1), vec![0]].concat()).contains("after"));
    let mut unaligned = [header(1, 2 * BLOCK, 1), extent(BLOCK, 1, 1)].concat();
    unaligned[snapshot::HEADER_BYTES] = 1;
    assert!(reason(unaligned).contains("aligned"));
    // A huge count or key length is a truncation, not an allocation.
    assert!(reason(header(1, 0, u64::MAX)).contains("truncated"));
    let mut key = [header(1, BLOCK, 1), extent(0, 1, 0x81)].concat();
    key.extend_from_slice(&1u32.to_le_bytes());
    key.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
    assert!(reason(key).contains("truncated"));
}

#[test]
fn sync_covers_every_write_and_a_failed_sync_fails_the_store() {
    let device = Arc::new(SimBlocks::new(3));
    let store = ValueStore::open(device.clone(), 1);
    assert!(!store.needs_sync());
    store.sync().unwrap();
    let a = live(&store, 100_000, 1);
    assert!(store.needs_sync());
    store.sync().unwrap();
    assert!(!store.needs_sync());
    // What was synced survives a crash; restored from a snapshot, it reads back.
    let snapshot = store.snapshot();
    let b = live(&store, 5000, 2);
    let crashed = Arc::new(device.crash());
    let (after, _) = ValueStore::restore(crashed, Path::new("c"), &snapshot).unwrap();
    assert_eq!(read_all(&after, &a).unwrap(), value(100_000, 1));
    assert_eq!(state_of(&after, &b), None);
    // A failed sync: the store stays dirty and takes no more writes or syncs.
    device.fail_syncs_after(0);
    let e = store.sync().unwrap_err();
    assert!(e.to_string().contains("EIO"), "{e}");
    assert!(store.needs_sync());
    device.clear_faults();
    assert!(matches!(store.sync(), Err(Error::Poisoned { .. })));
    assert!(matches!(store.write(b"x"), Err(Error::Poisoned { .. })));
    // Reads still work.
    assert_eq!(read_all(&store, &b).unwrap(), value(5000, 2));
}

#[test]
fn restore_then_discard_free_gives_back_what_no_replayed_record_claims() {
    let dir = tempfile::tempdir().unwrap();
    let segment = 16 * BLOCK;
    let files = || Arc::new(SegmentFiles::new(dir.path(), FILE_NAME, segment, false));
    let store = ValueStore::open(files(), 1);
    let a = live(&store, 30_000, 1);
    let snapshot = store.snapshot();
    // Written after the checkpoint: `b`'s record is replayed, `c`'s was lost.
    let b = live(&store, 70_000, 2);
    let c = live(&store, 200_000, 3);
    store.sync().unwrap();
    drop(store);
    let (store, _) = ValueStore::restore(files(), Path::new("c"), &snapshot).unwrap();
    store.mark_live(b, 0).unwrap();
    store.discard_free().unwrap();
    store.check();
    assert_eq!(read_all(&store, &a).unwrap(), value(30_000, 1));
    assert_eq!(read_all(&store, &b).unwrap(), value(70_000, 2));
    assert_eq!(store.stats().end_bytes, b.offset + b.extent_bytes());
    assert!(c.offset >= store.stats().end_bytes);
    // The files above the end are gone.
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let last = (store.stats().end_bytes - 1) / segment;
    let expected: Vec<String> = (0..=last).map(|s| format!("values-{s:08x}.vlog")).collect();
    assert_eq!(names, expected);
}

/// One step of the allocator's model test.
#[derive(Clone, Debug)]
enum Op {
    /// Write a value of this many bytes.
    Write(usize),
    /// Apply, abort, free or mark live the n-th reference written (modulo their number);
    /// apply and mark live for one of three keyspaces.
    Apply(usize, u32),
    Abort(usize),
    Free(usize),
    MarkLive(usize, u32),
    /// Drop a keyspace: free every live extent it owns.
    DropKeyspace(u32),
    /// Release with the oldest kept checkpoint this far below the newest.
    Release(u64),
    /// Open the next checkpoint's window; or take its snapshot and check a restore.
    OpenWindow,
    Snapshot,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop_oneof![0usize..9000, Just(65_536), 65_537usize..140_000].prop_map(Op::Write),
        3 => (any::<usize>(), 0u32..3).prop_map(|(n, k)| Op::Apply(n, k)),
        1 => any::<usize>().prop_map(Op::Abort),
        3 => any::<usize>().prop_map(Op::Free),
        1 => (any::<usize>(), 0u32..3).prop_map(|(n, k)| Op::MarkLive(n, k)),
        1 => (0u32..3).prop_map(Op::DropKeyspace),
        2 => (0u64..3).prop_map(Op::Release),
        1 => Just(Op::OpenWindow),
        1 => Just(Op::Snapshot),
    ]
}

/// The model's view of a reference written: its state, or gone (free space).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Model {
    Pending,
    Live,
    Deferred(u64),
    Gone,
}

fn run_model(ops: Vec<Op>) {
    let (device, store) = mem();
    let mut written: Vec<(ValueRef, u64, Model)> = Vec::new();
    // The keyspace that first made each written reference live: its owner for good.
    let mut owner: Vec<Option<u32>> = Vec::new();
    let (mut next_gen, mut generation) = (1u64, 0u64);
    for (step, op) in ops.into_iter().enumerate() {
        let pick = |n: usize| (!written.is_empty()).then(|| n % written.len());
        match op {
            Op::Write(len) => {
                let tag = step as u64;
                let r = store.write(&value(len, tag)).unwrap();
                written.push((r, tag, Model::Pending));
                owner.push(None);
            }
            Op::Apply(n, keyspace) => {
                // Only references the store still holds: an applied reference is
                // never one whose extent was reused.
                if let Some(i) = pick(n)
                    && written[i].2 != Model::Gone
                {
                    store.applied(written[i].0, keyspace, b"k");
                    if matches!(written[i].2, Model::Pending | Model::Live) {
                        written[i].2 = Model::Live;
                        owner[i].get_or_insert(keyspace);
                    }
                }
            }
            Op::Abort(n) => {
                if let Some(i) = pick(n) {
                    store.abort(written[i].0);
                    if written[i].2 == Model::Pending {
                        written[i].2 = Model::Gone;
                    }
                }
            }
            Op::Free(n) => {
                if let Some(i) = pick(n) {
                    store.free(written[i].0, 0, b"k");
                    if matches!(written[i].2, Model::Pending | Model::Live) {
                        written[i].2 = Model::Deferred(next_gen);
                    }
                }
            }
            Op::MarkLive(n, keyspace) => {
                // Recovery's view: a held reference (any state) becomes live.
                if let Some(i) = pick(n)
                    && written[i].2 != Model::Gone
                {
                    store.mark_live(written[i].0, keyspace).unwrap();
                    written[i].2 = Model::Live;
                    owner[i].get_or_insert(keyspace);
                }
            }
            Op::DropKeyspace(keyspace) => {
                let freed = store.drop_keyspaces(|k| k == keyspace);
                let mut expected = 0;
                for (w, o) in written.iter_mut().zip(&owner) {
                    if w.2 == Model::Live && *o == Some(keyspace) {
                        w.2 = Model::Deferred(next_gen);
                        expected += u64::from(w.0.len);
                    }
                }
                assert_eq!(freed, expected, "value bytes the drop freed");
            }
            Op::Release(behind) => {
                let oldest = generation.saturating_sub(behind);
                store.release(oldest).unwrap();
                for w in &mut written {
                    if matches!(w.2, Model::Deferred(g) if g <= oldest) {
                        w.2 = Model::Gone;
                    }
                }
            }
            Op::OpenWindow => {
                generation += 1;
                next_gen = generation + 1;
                store.open_window(generation);
            }
            Op::Snapshot => {
                let bytes = store.snapshot();
                let (restored, _) =
                    ValueStore::restore(device.clone(), Path::new("c"), &bytes).unwrap();
                restored.check();
                let recorded: Vec<_> = extents(&store)
                    .into_iter()
                    .filter(|(_, s)| *s != Extent::Pending)
                    .map(|(r, s)| match s {
                        Extent::Grace { free_gen } => (r, Extent::Deferred { free_gen }),
                        other => (r, other),
                    })
                    .collect();
                assert_eq!(extents(&restored), recorded);
                assert_eq!(owners(&restored), owners(&store));
            }
        }
        store.check();
        // The store holds exactly the model's references, in the model's states, and
        // every one of them still reads back: no two extents share a byte.
        let mut expected: Vec<(ValueRef, Extent)> = written
            .iter()
            .filter_map(|&(r, _, m)| {
                let state = match m {
                    Model::Pending => Extent::Pending,
                    Model::Live => Extent::Live,
                    Model::Deferred(free_gen) => Extent::Deferred { free_gen },
                    Model::Gone => return None,
                };
                Some((r, state))
            })
            .collect();
        expected.sort_by_key(|(r, _)| r.offset);
        assert_eq!(extents(&store), expected, "after step {step}");
        let mut expected_owners: Vec<(u64, u32)> = written
            .iter()
            .zip(&owner)
            .filter(|(w, _)| w.2 == Model::Live)
            .map(|(w, o)| (w.0.offset, o.expect("a live reference has an owner")))
            .collect();
        expected_owners.sort_unstable();
        assert_eq!(owners(&store), expected_owners, "owners after step {step}");
        // Checked now and then: a clobbered extent stays clobbered.
        for &(r, tag, m) in written.iter().filter(|_| step % 8 == 7) {
            if m != Model::Gone {
                assert_eq!(
                    read_all(&store, &r).unwrap(),
                    value(r.len as usize, tag),
                    "step {step}"
                );
            }
        }
    }
    for &(r, tag, m) in &written {
        if m != Model::Gone {
            assert_eq!(read_all(&store, &r).unwrap(), value(r.len as usize, tag));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_allocator_agrees_with_a_model(ops in prop::collection::vec(op(), 1..80)) {
        run_model(ops);
    }
}

/// Freed space within the slack stays written: a release gives it back to the free
/// ranges but punches no hole, so the next write there overwrites allocated blocks.
#[test]
fn freed_space_within_the_slack_stays_written_for_reuse() {
    let device = Arc::new(MemBlocks::new());
    let store = ValueStore::open(device.clone(), 1);
    let a = live(&store, 8000, 1);
    let _b = live(&store, 8000, 2);
    let blocks = device.block_count();
    store.free(a, 0, b"a");
    store.release(1).unwrap();
    assert_eq!(free_ranges(&store), [(a.offset, 2 * BLOCK)]);
    assert_eq!(
        device.block_count(),
        blocks,
        "no hole punched within the slack"
    );
    assert_eq!(live(&store, 7000, 3).offset, a.offset);
    store.check();
}

/// A release punches the holes of long extents (256 KiB or more) always, and of short
/// ones only past the slack of free space kept written (an eighth of the live bytes
/// here); free space kept before past a slack that since shrank is punched too.
/// Punched space is known as holes, which the next writes there take back.
#[test]
fn releases_punch_long_extents_and_short_ones_past_the_slack() {
    let device = Arc::new(MemBlocks::new());
    let store = ValueStore::open(device.clone(), 1).with_slack_floor(0);
    const EXTENT: u64 = 16 * BLOCK; // a value of 64 KiB
    let refs: Vec<ValueRef> = (0..64).map(|i| live(&store, 65_536, i)).collect();
    let long = live(&store, 300_000, 64);
    // Above them one stays live: the end stays where it is.
    live(&store, 65_536, 65);
    let unpunched = || store.state.lock().unpunched_bytes();
    let held = || device.block_count() as u64 * BLOCK;
    let slack = || store.slack(store.stats().live_bytes);
    let before = held();
    // Four short ones freed apart, within the slack: kept written. The long one is
    // punched.
    for r in [refs[3], refs[9], refs[15], refs[21], long] {
        store.free(r, 0, b"k");
    }
    store.release(1).unwrap();
    assert!(4 * EXTENT <= slack());
    assert_eq!(unpunched(), 4 * EXTENT);
    assert_eq!(held(), before - long.extent_bytes());
    store.check();
    // Twenty-three more: as many as fit in the slack are kept, the others punched.
    for r in &refs[41..] {
        store.free(*r, 0, b"k");
    }
    store.release(1).unwrap();
    let kept = slack() / EXTENT * EXTENT;
    assert_eq!(unpunched(), kept);
    assert_eq!(held(), before - long.extent_bytes() - (27 * EXTENT - kept));
    store.check();
    // Eighteen more, and the slack is less than what was kept: all eighteen are
    // punched, and of what was kept what is past the slack.
    for r in refs[22..41].iter().filter(|r| r.offset != refs[30].offset) {
        store.free(*r, 0, b"k");
    }
    store.release(1).unwrap();
    assert!(unpunched() <= slack() && unpunched() + BLOCK > slack());
    store.check();
    // Writes take holes back: what they allocate is no hole any more.
    let holes_before = store.state.lock().holes.bytes;
    let again: Vec<ValueRef> = (0..32).map(|i| live(&store, 65_536, 100 + i)).collect();
    let state = store.state.lock();
    for r in &again {
        assert!(state.holes.gaps(r.offset, r.offset + EXTENT) == [(r.offset, EXTENT)]);
    }
    assert!(state.holes.bytes < holes_before);
    drop(state);
    store.check();
}

/// A writer waits for room while the freed extents not yet reusable exceed the policy's
/// limit, until a release wakes it, or until its longest wait is over; below the limit
/// it does not wait.
#[test]
fn writers_wait_for_room_until_a_release_or_their_longest_wait() {
    let policy = |max_wait| Backpressure {
        live_divisor: 2,
        floor_bytes: 0,
        max_wait,
    };
    let store = Arc::new(
        ValueStore::open(Arc::new(MemBlocks::new()), 1)
            .with_backpressure(policy(std::time::Duration::from_secs(600))),
    );
    let refs: Vec<ValueRef> = (0..4).map(|i| live(&store, 8000, i)).collect();
    store.make_room();
    // One value live (a limit of 4000 bytes), three freed: 24 KiB wait.
    for r in &refs[1..] {
        store.free(*r, 0, b"k");
    }
    let (done_tx, done_rx) = mpsc::channel();
    let writer = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            store.make_room();
            done_tx.send(()).unwrap();
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(done_rx.try_recv().is_err(), "the writer did not wait");
    store.release(1).unwrap();
    done_rx.recv().unwrap();
    writer.join().unwrap();
    // Past the longest wait a writer goes on even if nothing was released, and until
    // the next release no writer waits.
    let store = ValueStore::open(Arc::new(MemBlocks::new()), 1)
        .with_backpressure(policy(std::time::Duration::from_millis(100)));
    let refs: Vec<ValueRef> = (0..2).map(|i| live(&store, 8000, i)).collect();
    store.free(refs[0], 0, b"k");
    store.make_room();
    for _ in 0..100 {
        store.make_room();
    }
    assert_eq!(store.stats().deferred_bytes, 2 * BLOCK);
    let room = store.room.as_ref().unwrap();
    assert_eq!(room.waiting.lock().gave_up_at, Some(0));
    store.release(1).unwrap();
    assert_eq!(room.waiting.lock().count, 1);
}

/// Values written behind read back whole before and after their writes reach the
/// device, over memory, simulated and real segment files (the last on io_uring); a
/// sync leaves none of them in memory.
#[test]
fn written_behind_values_read_back_before_and_after_they_reach_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let devices: Vec<(Arc<dyn BlockDevice>, &str)> = vec![
        (Arc::new(MemBlocks::new()), "memory"),
        (Arc::new(SimBlocks::new(3)), "simulated"),
        (
            Arc::new(SegmentFiles::new(
                dir.path(),
                ("wb", "vlog"),
                40 * BLOCK,
                true,
            )),
            "segment files, direct",
        ),
    ];
    for (device, what) in devices {
        // A limit of 64 KiB: writers wait for room now and then.
        let store = ValueStore::open(device, 1).write_behind(64 << 10).unwrap();
        let written: Vec<(ValueRef, Vec<u8>)> = (0..200u64)
            .map(|i| {
                let v = value(1 + (i as usize * 997) % 70_000, i);
                (store.write(&v).unwrap(), v)
            })
            .collect();
        for (r, v) in &written {
            assert_eq!(read_all(&store, r).unwrap(), *v, "{what}: before a sync");
            let part = store.read_range(r, 1, v.len().min(10) - 1, &mut Vec::new());
            assert!(part.is_ok(), "{what}");
        }
        store.sync().unwrap();
        assert!(
            !store.stager.as_ref().unwrap().busy(),
            "{what}: a sync waits for them"
        );
        for (r, v) in &written {
            assert_eq!(read_all(&store, r).unwrap(), *v, "{what}: after a sync");
        }
        store.check();
    }
}

/// A crash keeps every value written behind before the last sync, whole; one written
/// after it may be lost, never half there (the store reads it back whole or fails its
/// checksum).
#[test]
fn a_crash_keeps_the_values_written_behind_before_the_last_sync() {
    let device = Arc::new(SimBlocks::new(11));
    let store = ValueStore::open(device.clone(), 1)
        .write_behind(1 << 20)
        .unwrap();
    let synced: Vec<(ValueRef, Vec<u8>)> = (0..40u64)
        .map(|i| {
            let v = value(3000 + i as usize * 100, i);
            (store.write(&v).unwrap(), v)
        })
        .collect();
    store.sync().unwrap();
    let unsynced: Vec<(ValueRef, Vec<u8>)> = (40..80u64)
        .map(|i| {
            let v = value(3000 + i as usize * 100, i);
            (store.write(&v).unwrap(), v)
        })
        .collect();
    let crashed = Arc::new(device.crash());
    let after = ValueStore::open(crashed, 1);
    for (r, v) in &synced {
        after.mark_live(*r, 0).unwrap();
        assert_eq!(read_all(&after, r).unwrap(), *v);
    }
    for (r, v) in &unsynced {
        after.mark_live(*r, 0).unwrap();
        if let Ok(got) = read_all(&after, r) {
            assert_eq!(got, *v, "a value after the sync came back mixed");
        }
    }
    drop(store);
}

/// A write behind that fails makes the next sync fail and the store refuse writes;
/// the value stays readable from memory meanwhile.
#[test]
fn a_failed_write_behind_fails_the_next_sync_and_later_writes() {
    let device = Arc::new(MemBlocks::new());
    let store = ValueStore::open(device.clone(), 1)
        .write_behind(1 << 20)
        .unwrap();
    device.fail_writes();
    let v = value(5000, 1);
    let r = store.write(&v).unwrap();
    assert!(matches!(store.sync(), Err(Error::Poisoned { .. })));
    assert!(store.write(&value(5000, 2)).is_err());
    assert_eq!(read_all(&store, &r).unwrap(), v);
}

/// A store like `mem()`'s whose cache has `bytes` of capacity.
fn mem_cached(bytes: u64) -> (Arc<MemBlocks>, ValueStore) {
    let (device, store) = mem();
    store.cache().set_capacity(bytes);
    (device, store)
}

#[test]
fn with_crc_makes_other_bytes_of_the_same_checksum() {
    let v = value(8000, 1);
    let w = with_crc(value(8000, 2), crc32c::crc32c(&v));
    assert_ne!(v, w);
    assert_eq!(crc32c::crc32c(&v), crc32c::crc32c(&w));
}

/// Written values are cached; reads of them, whole or in part, are answered from memory
/// without a device read.
#[test]
fn written_values_are_read_from_the_cache_whole_and_in_part() {
    let (device, store) = mem_cached(8 << 20);
    let v = value(20_000, 1);
    let r = store.write(&v).unwrap();
    store.applied(r, 0, b"k");
    assert!(store.cache().holds(r.offset));
    // The next device read fails: the hits make none.
    device.fail_reads(1);
    assert_eq!(read_all(&store, &r).unwrap(), v);
    let mut part = Vec::new();
    store.read_range(&r, 5000, 100, &mut part).unwrap();
    assert_eq!(part, v[5000..5100]);
    let stats = store.cache().stats();
    assert_eq!((stats.hits, stats.misses), (2, 0));
    // A value too large for the cache is read from the device.
    let big = value(2 << 20, 2);
    let rb = store.write(&big).unwrap();
    assert!(!store.cache().holds(rb.offset));
    assert!(read_all(&store, &rb).is_err(), "the device's read fails");
    assert_eq!(read_all(&store, &rb).unwrap(), big);
}

/// The invalidation rule: an extent's entry is dropped when it is freed, and again, after
/// the readers that found the extent before its free are gone, by the release that makes
/// its space reusable. A reader that found the value before the free caches it again
/// meanwhile; were the release not to drop that entry, the value written next into the
/// extent — here of the same length and checksum, so of the same reference — would be
/// answered with the old bytes (and builds with debug assertions stop at the write).
#[test]
fn an_entry_is_dropped_before_its_extent_is_reused_by_a_value_of_the_same_reference() {
    let (_device, store) = mem_cached(8 << 20);
    let old = value(8000, 1);
    let r = store.write(&old).unwrap();
    store.applied(r, 0, b"k");
    assert_eq!(read_all(&store, &r).unwrap(), old);
    let reader = store.read_guard();
    store.free(r, 0, b"k");
    assert!(!store.cache().holds(r.offset), "dropped at the free");
    // The reader found `r` before the free: it reads the old value and caches it.
    assert_eq!(read_all(&store, &r).unwrap(), old);
    assert!(store.cache().holds(r.offset));
    drop(reader);
    store.release(1).unwrap();
    assert!(
        !store.cache().holds(r.offset),
        "dropped by the release, before the space can be reused"
    );
    let new = with_crc(value(8000, 2), r.crc);
    let again = store.write(&new).unwrap();
    assert_eq!(again, r, "the same extent, length and checksum");
    store.applied(again, 0, b"k");
    assert_eq!(read_all(&store, &again).unwrap(), new);
    store.cache().check();
    store.check();
}

/// An aborted write's extent is free at once: its entry goes with it. Recovery's
/// `mark_live` drops the extents it overlaps that were freed, and their entries.
#[test]
fn abort_and_mark_live_over_freed_extents_drop_their_entries() {
    let (_device, store) = mem_cached(8 << 20);
    let r = store.write(&value(5000, 1)).unwrap();
    assert!(store.cache().holds(r.offset));
    store.abort(r);
    assert!(!store.cache().holds(r.offset));
    let r = live(&store, 5000, 2);
    let reader = store.read_guard();
    store.free(r, 0, b"k");
    read_all(&store, &r).unwrap();
    assert!(store.cache().holds(r.offset));
    drop(reader);
    let over = ValueRef {
        offset: r.offset,
        len: 100,
        crc: 7,
    };
    store.mark_live(over, 0).unwrap();
    assert!(!store.cache().holds(r.offset));
    store.check();
}

/// `read_many` reads values of every size together (the small ones in one io_uring
/// batch from real segment files), from the cache, the write-behind queue and the files
/// alike, and a value whose bytes were damaged on disk is still an error naming its file,
/// never wrong bytes.
#[test]
fn read_many_reads_values_together_and_still_refuses_damaged_ones() {
    let dir = tempfile::tempdir().unwrap();
    let files = Arc::new(SegmentFiles::new(
        dir.path(),
        ("rm", "vlog"),
        64 * BLOCK,
        true,
    ));
    let store = ValueStore::open(files, 1).write_behind(64 << 10).unwrap();
    let sizes = [0usize, 1, 3000, 4096, 9000, 65536, 70_000, 200_000];
    let written: Vec<(ValueRef, Vec<u8>)> = (0..40u64)
        .map(|i| {
            let v = value(sizes[i as usize % sizes.len()], i);
            let r = store.write(&v).unwrap();
            store.applied(r, 0, b"k");
            (r, v)
        })
        .collect();
    let refs: Vec<ValueRef> = written.iter().map(|(r, _)| *r).collect();
    // Some still queued behind their writers, then all on the files (no cache), then
    // from the cache.
    for pass in 0..3 {
        if pass == 1 {
            store.sync().unwrap();
        }
        if pass == 2 {
            store.cache().set_capacity(4 << 20);
        }
        let mut outs = vec![b"old".to_vec(); refs.len()];
        store.read_many(&refs, &mut outs).unwrap();
        for ((_, v), out) in written.iter().zip(&outs) {
            assert!(out == v, "a value of {} bytes read back wrong", v.len());
        }
    }
    // Damage one small value's bytes on disk; with the cache off, it is read in a batch
    // with the other small ones.
    store.cache().set_capacity(0);
    let victim = refs[2];
    assert_eq!(victim.len, 3000);
    let path = dir.path().join("rm-00000000.vlog");
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, b"X", victim.offset + 10).unwrap();
    let mut outs = vec![Vec::new(); refs.len()];
    let e = store.read_many(&refs, &mut outs).unwrap_err();
    assert!(e.to_string().contains("rm-00000000.vlog"), "{e}");
}

/// Values of a mebibyte and more on O_DIRECT files of 1.5 MiB segments: written and
/// read in groups of pieces in flight together, the pieces split at every segment's
/// end. Whole reads and ranges across chunks, pieces, groups and segments return the
/// written bytes; a damaged chunk table or chunk fails the whole read naming the file,
/// and a range that avoids the damaged chunk still reads.
#[test]
fn long_values_go_to_the_device_in_groups_across_segments_and_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let segment = 384 * BLOCK;
    let files = Arc::new(SegmentFiles::new(
        dir.path(),
        ("big", "vlog"),
        segment,
        true,
    ));
    let store = ValueStore::open(files, 1);
    let sizes = [
        1 << 20,
        (1 << 20) + 1,
        (3 << 20) + 5,
        (9 << 20) + 7,
        200_000,
    ];
    let written: Vec<(ValueRef, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let v = value(len, i as u64);
            let r = store.write(&v).unwrap();
            store.applied(r, 0, b"k");
            (r, v)
        })
        .collect();
    store.sync().unwrap();
    let mut out = Vec::new();
    for (r, v) in &written {
        store.read(r, &mut out).unwrap();
        assert!(out == *v, "a value of {} bytes read back wrong", v.len());
        let len = v.len() as u64;
        for (from, n) in [
            (0, 1),
            (CHUNK_BYTES - 3, 7),
            (IO_PIECE_BYTES - 100, 4096),
            (segment - 10, 20),
            (IN_FLIGHT_BYTES - 5, 10),
            (len / 3, (len / 2) as usize),
            (len - 1, 1),
        ] {
            if from + n as u64 > len {
                continue;
            }
            store.read_range(r, from, n, &mut out).unwrap();
            let want = &v[from as usize..from as usize + n];
            assert!(out == want, "bytes {from}..+{n} of {len}");
        }
    }
    let damage = |address: u64| {
        let path = dir
            .path()
            .join(format!("big-{:08x}.vlog", address / segment));
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, b"\xff", address % segment).unwrap();
        path.file_name().unwrap().to_string_lossy().into_owned()
    };
    // The 1 MiB value's chunk table, read in the same group as the value.
    let (r, _) = &written[0];
    let file = damage(r.offset + u64::from(r.len) + 1);
    let e = store.read(r, &mut out).unwrap_err().to_string();
    assert!(e.contains("chunk table") && e.contains(&file), "{e}");
    assert!(out.is_empty());
    // Chunk 100 of the 9 MiB value, in its third group.
    let (r, v) = &written[3];
    let file = damage(r.offset + 100 * CHUNK_BYTES + 5);
    let e = store.read(r, &mut out).unwrap_err().to_string();
    assert!(e.contains("chunk 100") && e.contains(&file), "{e}");
    store
        .read_range(r, 0, 100 * CHUNK_BYTES as usize, &mut out)
        .unwrap();
    assert!(out == v[..100 * CHUNK_BYTES as usize]);
    let e = store
        .read_range(r, 100 * CHUNK_BYTES, 10, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("chunk 100"), "{e}");
    // The others are untouched.
    for (r, v) in [&written[1], &written[2], &written[4]] {
        store.read(r, &mut out).unwrap();
        assert!(out == *v);
    }
}
