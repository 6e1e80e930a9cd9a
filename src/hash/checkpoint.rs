//! A hash keyspace's record in a database checkpoint: what [`HashStore::checkpoint`]
//! captured ([`F2Extents`]: each log's begin and tail, the indexes' home buckets), its
//! bytes in the checkpoint file, and the lowest BEGIN of each log that a set of kept
//! checkpoints needs. The database's checkpoint file holds these bytes without reading
//! them; this module alone knows what they mean.
//!
//! # Layout (little-endian, [`ENCODED_BYTES`])
//!
//! ```text
//! hot log begin, hot log tail, hot index home buckets,
//! cold log begin, cold log tail,
//! chunk log begin, chunk log tail, chunk table home buckets      (u64 each)
//! ```
//!
//! [`HashStore::checkpoint`]: super::store::HashStore::checkpoint

#![deny(clippy::indexing_slicing)]

pub(crate) use super::f2::F2Extents;
use super::hlog::LogExtent;

/// The fields of a hash keyspace's record, in file order.
const FIELDS: usize = 8;

/// The bytes of a hash keyspace's record in a checkpoint file.
pub(crate) const ENCODED_BYTES: usize = FIELDS * 8;

impl F2Extents {
    /// The record's bytes (module docs).
    pub(crate) fn encode(&self) -> [u8; ENCODED_BYTES] {
        let fields = [
            self.hot.begin,
            self.hot.tail,
            self.hot_buckets,
            self.cold.begin,
            self.cold.tail,
            self.chunks.begin,
            self.chunks.tail,
            self.chunk_buckets,
        ];
        let mut bytes = [0u8; ENCODED_BYTES];
        for (chunk, n) in bytes.chunks_exact_mut(8).zip(fields) {
            chunk.copy_from_slice(&n.to_le_bytes());
        }
        bytes
    }

    /// The record `bytes` encode. Any bytes decode (whether the extents make sense is
    /// checked when the store is opened on them).
    pub(crate) fn decode(bytes: &[u8; ENCODED_BYTES]) -> F2Extents {
        let mut fields = [0u64; FIELDS];
        for (n, chunk) in fields.iter_mut().zip(bytes.chunks_exact(8)) {
            *n = u64::from_le_bytes(chunk.try_into().expect("chunks of 8 bytes"));
        }
        let [
            hot_begin,
            hot_tail,
            hot_buckets,
            cold_begin,
            cold_tail,
            chunks_begin,
            chunks_tail,
            chunk_buckets,
        ] = fields;
        F2Extents {
            hot: LogExtent {
                begin: hot_begin,
                tail: hot_tail,
            },
            hot_buckets,
            cold: LogExtent {
                begin: cold_begin,
                tail: cold_tail,
            },
            chunks: LogExtent {
                begin: chunks_begin,
                tail: chunks_tail,
            },
            chunk_buckets,
        }
    }
}

/// The lowest BEGIN of each of a store's logs (hot, cold, chunk) that the checkpoints
/// `recorded` need: the floors [`HashStore::open`] and [`HashStore::retain_from`] take.
/// `[0; 3]` (keep everything) if there are none.
///
/// [`HashStore::open`]: super::store::HashStore::open
/// [`HashStore::retain_from`]: super::store::HashStore::retain_from
pub(crate) fn floors(recorded: &[&F2Extents]) -> [u64; 3] {
    if recorded.is_empty() {
        return [0; 3];
    }
    let low = |f: fn(&F2Extents) -> u64| recorded.iter().map(|e| f(e)).min().unwrap_or(0);
    [
        low(|e| e.hot.begin),
        low(|e| e.cold.begin),
        low(|e| e.chunks.begin),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_its_eight_numbers_in_file_order_and_decodes_back() {
        let numbers = [64u64, 9000, 1024, 64, 4096, 128, 70000, 256];
        let bytes: Vec<u8> = numbers.iter().flat_map(|n| n.to_le_bytes()).collect();
        let bytes: [u8; ENCODED_BYTES] = bytes.try_into().unwrap();
        let e = F2Extents::decode(&bytes);
        assert_eq!((e.hot.begin, e.hot.tail, e.hot_buckets), (64, 9000, 1024));
        assert_eq!((e.cold.begin, e.cold.tail), (64, 4096));
        assert_eq!(
            (e.chunks.begin, e.chunks.tail, e.chunk_buckets),
            (128, 70000, 256)
        );
        assert_eq!(e.encode(), bytes);
    }

    #[test]
    fn floors_are_each_logs_lowest_begin_or_zero_for_none() {
        let at = |hot, cold, chunks| {
            let mut e = F2Extents::default();
            (e.hot.begin, e.cold.begin, e.chunks.begin) = (hot, cold, chunks);
            e
        };
        let (a, b) = (at(10, 50, 7), at(20, 40, 9));
        assert_eq!(floors(&[&a, &b]), [10, 40, 7]);
        assert_eq!(floors(&[]), [0; 3]);
    }
}
