//! A short tour of the `Tree` API: insert, get, delete, range and prefix scans, stats.
//!
//! Run: `cargo run --example tree`.

use bfdb::{Config, Tree};

fn main() -> Result<(), bfdb::Error> {
    // A small memory budget, so this tour also exercises eviction to the leaf pages.
    let dir = tempfile::tempdir().map_err(bfdb::Error::Io)?;
    let tree = Tree::open(
        dir.path().join("tour.bfdb"),
        Config {
            memory_budget_bytes: 256 << 10,
            ..Config::default()
        },
    )?;

    for i in 0..50_000u32 {
        let key = format!("user:{i:08}");
        tree.insert(key.as_bytes(), &i.to_le_bytes())?;
    }
    tree.delete(b"user:00000007")?;

    assert_eq!(
        tree.get(b"user:00000042")?,
        Some(42u32.to_le_bytes().to_vec())
    );
    assert_eq!(tree.get(b"user:00000007")?, None);

    // Reuse one buffer across reads: no allocation once it has grown.
    let mut value = Vec::new();
    if tree.get_into(b"user:00049999", &mut value)? {
        println!(
            "user:00049999 -> {}",
            u32::from_le_bytes(value[..4].try_into().unwrap())
        );
    }

    // Inclusive, exclusive and unbounded ranges, forwards and backwards.
    let first: Vec<String> = tree
        .range(&b"user:00000005"[..]..&b"user:00000010"[..])
        .map(|r| r.map(|(k, _)| String::from_utf8_lossy(&k).into_owned()))
        .collect::<Result<_, _>>()?;
    println!("range [5, 10): {first:?}");
    let last = tree.range::<&[u8], _>(..).next_back().transpose()?;
    println!(
        "last key: {:?}",
        last.map(|(k, _)| String::from_utf8_lossy(&k).into_owned())
    );
    let in_prefix = tree.prefix(b"user:0001").count();
    println!("keys with prefix user:0001: {in_prefix}");

    tree.flush()?;
    let s = tree.stats();
    println!(
        "height {}, {} leaf splits, {} merges, {} evictions, {} leaf reads, {} leaf writes",
        s.height, s.leaf_splits, s.merges, s.evictions, s.leaf_reads, s.leaf_writes
    );
    Ok(())
}
