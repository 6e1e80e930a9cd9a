//! The database directory's own files from untrusted bytes: the manifest and the
//! checkpoint decoders must answer `Ok` or `Err` for any input, never panic, hang or
//! over-allocate, and whatever decodes must encode back to the same bytes. The input
//! also gets a valid header and checksum put in front of it, once for each format
//! version the build reads (manifests 1 and 2, checkpoints 1 to 4: version 4 gives the
//! pages of each leaf, and a manifest's keyspace of kind 5 its pages per leaf), so the
//! fuzzer reaches every version's body decoders and not only the checksum checks; the
//! current versions' bodies must encode back too.

#![no_main]

use libfuzzer_sys::fuzz_target;

/// The manifest and checkpoint format versions this build reads, the last of each the
/// one it writes (`MANIFEST_VERSION`, `CHECKPOINT_VERSION`).
const MANIFEST_VERSIONS: std::ops::RangeInclusive<u32> = 1..=2;
const CHECKPOINT_VERSIONS: std::ops::RangeInclusive<u32> = 1..=4;

fuzz_target!(|data: &[u8]| {
    bfdb::fuzz_decode_files(data);
    for version in MANIFEST_VERSIONS {
        // A manifest header with a correct checksum over the input as its body.
        let mut manifest = b"BFDBMANI".to_vec();
        manifest.extend_from_slice(&version.to_le_bytes());
        manifest.extend_from_slice(&crc32c::crc32c(data).to_le_bytes());
        manifest.extend_from_slice(&(data.len() as u32).to_le_bytes());
        manifest.extend_from_slice(data);
        bfdb::fuzz_decode_files(&manifest);
    }
    for version in CHECKPOINT_VERSIONS {
        // A checkpoint body with a valid magic and version, and a correct trailer.
        let mut checkpoint = b"BFDBCKPT".to_vec();
        checkpoint.extend_from_slice(&version.to_le_bytes());
        checkpoint.extend_from_slice(data);
        let crc = crc32c::crc32c(&checkpoint);
        let len = checkpoint.len() as u64;
        checkpoint.extend_from_slice(&len.to_le_bytes());
        checkpoint.extend_from_slice(&crc.to_le_bytes());
        bfdb::fuzz_decode_files(&checkpoint);
    }
});
