//! `Config::validate` and the tree constructors agree: a configuration `validate` accepts
//! opens with every constructor, one it rejects is rejected by every constructor, and no
//! refusal names an internal field instead of the user's.

use bfdb::storage::MemoryStore;
use bfdb::{Backend, Config, Error, Tree};

/// Names of internal settings that a user's error message must not mention.
const INTERNAL_NAMES: &[&str] = &["capacity_bytes", "max_block_size_bytes", "pool "];

/// A configuration with `memory_budget_bytes` and no background thread or huge pages, so
/// that opening many trees stays cheap.
fn with_budget(memory_budget_bytes: u64) -> Config {
    Config {
        memory_budget_bytes,
        huge_pages: false,
        background_eviction: false,
        backend: Backend::Std,
        ..Config::default()
    }
}

/// Budgets around every boundary: zero, below and at the 64 KiB minimum, each byte
/// across it, odd values and primes, and large ones that still fit in memory.
fn budgets() -> Vec<u64> {
    let mut budgets = vec![0, 1, 7, 8, 4096, 16_400, 65_535, 65_536, 65_537];
    budgets.extend(65_530..65_560);
    budgets.extend([
        100_003,
        131_071,
        1_000_001,
        1_048_573,
        16_777_259,
        (64 << 20) + 5,
        (1 << 30) + 3,
    ]);
    budgets
}

/// Which refusal an `Err` is, for the messages of a failed assertion.
fn describe(result: &Result<Tree, Error>) -> String {
    match result {
        Ok(_) => "Ok".to_string(),
        Err(e) => format!("Err({e})"),
    }
}

/// Checks that `opened` agrees with `validated` for `budget`, and that a refusal speaks
/// in the user's terms.
fn check_agreement(
    constructor: &str,
    budget: u64,
    validated: &bfdb::Result<()>,
    opened: bfdb::Result<Tree>,
) {
    assert_eq!(
        validated.is_ok(),
        opened.is_ok(),
        "memory_budget_bytes {budget}: validate() gave {validated:?} but {constructor} gave {}",
        describe(&opened)
    );
    if let Err(e) = &opened {
        let message = e.to_string();
        for name in INTERNAL_NAMES {
            assert!(
                !message.contains(name),
                "memory_budget_bytes {budget}: {constructor} names an internal setting: {message}"
            );
        }
        assert!(
            matches!(e, Error::InvalidConfig(m) if m.contains("memory_budget_bytes")),
            "memory_budget_bytes {budget}: {constructor} should name memory_budget_bytes: {message}"
        );
    }
}

#[test]
fn validate_and_every_constructor_agree_on_the_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    for (i, budget) in budgets().into_iter().enumerate() {
        let config = with_budget(budget);
        let validated = config.validate();
        if let Err(e) = &validated {
            let message = e.to_string();
            assert!(
                message.contains("memory_budget_bytes")
                    && !INTERNAL_NAMES.iter().any(|n| message.contains(n)),
                "memory_budget_bytes {budget}: validate() should name only the budget: {message}"
            );
        }
        check_agreement(
            "Tree::in_memory",
            budget,
            &validated,
            Tree::in_memory(config.clone()),
        );
        check_agreement(
            "Tree::with_page_store",
            budget,
            &validated,
            Tree::with_page_store(config.clone(), MemoryStore::new()),
        );
        let path = dir.path().join(format!("tree-{i}"));
        check_agreement("Tree::open", budget, &validated, Tree::open(&path, config));
    }
}

#[test]
fn budgets_below_the_minimum_are_refused_and_the_minimum_is_accepted() {
    for budget in [0, 1, 4096, 65_535] {
        assert!(
            matches!(with_budget(budget).validate(), Err(Error::InvalidConfig(_))),
            "{budget}"
        );
    }
    for budget in [65_536, 65_537, 100_003, 1_000_001] {
        assert!(with_budget(budget).validate().is_ok(), "{budget}");
    }
}

#[test]
fn budgets_too_large_for_the_mapping_table_are_refused() {
    assert!(with_budget((1 << 47) - 1).validate().is_ok());
    for budget in [1 << 47, (1 << 47) + 1, u64::MAX] {
        assert!(
            matches!(with_budget(budget).validate(), Err(Error::InvalidConfig(m)) if m.contains("memory_budget_bytes")),
            "{budget}"
        );
    }
}

/// A tree whose budget is not a multiple of the pool's 8-byte granularity works: it
/// stores and reads back records, evicting to stay within the budget.
#[test]
fn an_odd_budget_runs_a_tree_within_it() {
    let budget = 100_003;
    let tree = Tree::in_memory(with_budget(budget)).unwrap();
    for i in 0..5_000u32 {
        tree.insert(&i.to_be_bytes(), &[7; 40]).unwrap();
    }
    for i in 0..5_000u32 {
        assert_eq!(
            tree.get(&i.to_be_bytes()).unwrap(),
            Some(vec![7; 40]),
            "{i}"
        );
    }
    // 5000 records of about 50 bytes do not fit in 100 KB: the pool evicted, and holds
    // no more than the budget.
    let stats = tree.stats();
    assert!(stats.evictions > 0, "{stats:?}");
    assert!(stats.pool.bytes_in_use <= budget, "{stats:?}");
}

/// The key and inline value limits are what `Config` documents: at the defaults and at
/// each corner of `3 * max_key_bytes + max_inline_value_bytes <= 4040` a tree on a small pool (so records
/// are merged into leaf pages, which split) stores and reads back records of exactly
/// the largest sizes and refuses one byte more, and at a corner no limit can grow.
#[test]
fn records_of_the_largest_sizes_fit_at_every_corner_of_the_limit() {
    assert_eq!(bfdb::config::MAX_FENCES_AND_RECORD_BYTES, 4040);
    for (max_key, max_value) in [(512, 2048), (664, 2048), (512, 2504), (1346, 2), (1, 4037)] {
        let config = Config {
            max_key_bytes: max_key,
            max_value_bytes: max_value,
            max_inline_value_bytes: max_value,
            ..with_budget(64 << 10)
        };
        config.validate().unwrap();
        if 3 * max_key + max_value == 4040 {
            // A corner: one byte more of key or value does not fit.
            let one_more_key = Config {
                max_key_bytes: max_key + 1,
                ..config.clone()
            };
            let one_more_value = Config {
                max_value_bytes: max_value + 1,
                max_inline_value_bytes: max_value + 1,
                ..config.clone()
            };
            assert!(one_more_key.validate().is_err(), "{max_key} {max_value}");
            assert!(one_more_value.validate().is_err(), "{max_key} {max_value}");
        }
        let tree = Tree::in_memory(config).unwrap();
        // Keys of exactly `max_key` bytes that differ in their first byte (and so share
        // no prefix) as far as one byte allows, then in their last.
        let count: u32 = if max_key == 1 { 256 } else { 400 };
        let key = |i: u32| {
            let mut k = vec![b'k'; max_key];
            k[0] = (i.wrapping_mul(97) % 256) as u8;
            if max_key > 1 {
                k[max_key - 1] = (i / 256) as u8;
            }
            k
        };
        let value = |i: u32| vec![i as u8; max_value];
        for i in 0..count {
            tree.insert(&key(i), &value(i)).unwrap();
        }
        for i in 0..count {
            assert_eq!(
                tree.get(&key(i)).unwrap(),
                Some(value(i)),
                "{max_key} {max_value}: {i}"
            );
        }
        assert_eq!(tree.range::<&[u8], _>(..).count(), count as usize);
        let stats = tree.stats();
        assert!(stats.leaf_splits > 0, "{max_key} {max_value}: {stats:?}");
        assert!(matches!(
            tree.insert(&vec![b'k'; max_key + 1], b""),
            Err(Error::KeyTooLarge { .. })
        ));
        assert!(matches!(
            tree.insert(b"k", &vec![0; max_value + 1]),
            Err(Error::ValueTooLarge { .. })
        ));
    }
}
